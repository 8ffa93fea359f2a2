//! `herald bench`: Herald's load generator, and the same scenarios driven
//! against the servers users would pick instead (bench/peers/), so one run
//! compares them on one machine.
//!
//! Each scenario (`idle`, `fanout`, `p2p`, `publish`, `reconnect`, `acked`,
//! `scheduled`, `cluster`) is
//! bounded in count and time, prints a human summary, appends one JSON
//! object per run to `--json`, and **verifies as it measures**: every
//! subscriber checks that each expected message arrived once and in order
//! (by the publisher's sequence number in the payload, and by Herald's
//! `seq`). Any loss, duplicate or reorder fails the run loudly with a
//! non-zero exit.
//!
//! Subscriber connections live in worker processes (the binary re-executed
//! as `herald bench worker`), a few thousand each, bound to source
//! addresses 127.0.0.2, 127.0.0.3, … so neither the per-process open-files
//! limit nor ephemeral ports cap the connection count. Server memory and CPU
//! come from `/proc/PID` of `--server-pid`.
//!
//! What it must never do: run without a bound, report figures from a run
//! whose deliveries did not check out without saying so, or change the
//! server it measures (the one fault it injects is `cluster --kill-node`,
//! a SIGKILL to the node the operator named).

mod args;
mod fleet;
mod herald_api;
mod hist;
mod http1;
mod payload;
mod pipelined;
mod proc_stats;
mod protocol;
mod publisher;
mod redis_info;
mod report;
mod scenario;
mod tally;
mod worker;

use std::process::ExitCode;

pub use args::{BenchArgs, Peer, PublishVia, Rate, Scenario};

/// Run `herald bench ...` to completion. The binary must route
/// `<exe> bench worker` here too: the bench starts its workers that way.
pub fn main(args: BenchArgs) -> ExitCode {
    let result = if args.scenario == Scenario::Worker {
        worker::main()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(scenario::run(&args)))
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("herald bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}
