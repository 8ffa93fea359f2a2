//! Herald nodes on a shared Redis, in this process (`herald_test_support::Node`):
//! one binary, one module per behaviour. The tests that run nodes as real
//! `herald` processes (to kill or freeze them) are their own binaries:
//! `redis_under_faults.rs`, `scheduled_across_nodes.rs`,
//! `webhook_failover.rs`.

#[path = "../common/centrifugo.rs"]
mod centrifugo;

mod batch_publish_on_redis;
mod control_across_nodes;
mod cross_node_delivery;
mod pipelined_publish_on_redis;
mod presence_across_nodes;
mod redis_faults;
mod rooms_across_nodes;
