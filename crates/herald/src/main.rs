//! The `herald` command: `serve`, `publish`, `tail`, `config`.

mod admin_cli;
mod cli;
mod config_load;
mod otel;

use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use config_load::ServeFlags;
use herald_server::config::EngineKind;
use herald_server::Server;
use herald_store::{EmbeddedEngine, StoreConfig};

/// jemalloc rather than glibc's `malloc`: what the store's writer thread
/// allocates for a publish the sessions' threads free (and the other way
/// round), and buffers of tens of KiB come and go between the small
/// allocations; glibc answers both with arena locks and fastbin
/// consolidation, a fifth of a publish's instructions under
/// `bench/callgrind.sh`.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "herald",
    version,
    about = "Realtime message delivery: durable, ordered, exactly-once publish"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the server (embedded engine in --data-dir, or --engine redis)
    Serve(ServeFlags),
    /// Publish one message over the HTTP API
    Publish(cli::PublishArgs),
    /// Publish many messages (JSON lines from a file or stdin) in batched requests
    PublishBatch(cli::PublishBatchArgs),
    /// Subscribe to a channel and print its messages (resumes on reconnect)
    Tail(cli::TailArgs),
    /// Act on a user's connections on every node (list, disconnect, ban,
    /// revoke, subscribe, unsubscribe, remove from a room)
    Users(admin_cli::UsersArgs),
    /// List the channels with a subscriber on some node
    Channels(admin_cli::ChannelsArgs),
    /// List the nodes of the deployment
    Nodes(admin_cli::NodesArgs),
    /// Print the configuration layout: every key with its default (TOML)
    Config,
    /// Load generator and benchmarks (see docs/benchmarks.md)
    Bench(Box<herald_bench::BenchArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Config => {
            print!("{}", config_load::default_toml());
            ExitCode::SUCCESS
        }
        Command::Serve(flags) => {
            let loaded = match config_load::load(&flags) {
                Ok(loaded) => loaded,
                Err(e) => {
                    eprintln!("herald: invalid configuration: {e}");
                    return ExitCode::from(config_load::EXIT_CONFIG as u8);
                }
            };
            let (log_filter, _traces) = init_tracing(loaded.config.log.as_deref());
            if let Some(file) = config_load::config_file(&flags) {
                tracing::info!(file = %file.display(), "configuration file read");
            }
            for deprecation in &loaded.deprecations {
                tracing::warn!("{deprecation}");
            }
            run_async(serve(loaded.config, flags, log_filter))
        }
        Command::Publish(args) => run_async(cli::publish(args)),
        Command::PublishBatch(args) => run_async(cli::publish_batch(args)),
        Command::Tail(args) => run_async(cli::tail(args)),
        Command::Users(args) => run_async(admin_cli::users(args)),
        Command::Channels(args) => run_async(admin_cli::channels(args)),
        Command::Nodes(args) => run_async(admin_cli::nodes(args)),
        Command::Bench(args) => herald_bench::main(*args),
    }
}

fn run_async(fut: impl std::future::Future<Output = anyhow::Result<()>>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("herald: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(fut) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("herald: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The log filter without `log` (or `HERALD_LOG`): the storage library's
/// own info lines (ingestion, flushes) are noise at the default level.
const DEFAULT_LOG: &str = "info,fjall=warn,lsm_tree=warn";

/// Logs to stderr with `log` (checked by `config_load::load`;
/// `HERALD_LOG_FORMAT`), and traces over OTLP when the environment asks
/// for them (`otel.rs`). Returns how a reload puts another log filter in
/// force, and the traces' provider, flushed when dropped.
fn init_tracing(log: Option<&str>) -> (herald_server::reload::LogFilter, Option<otel::Traces>) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{reload, EnvFilter, Layer, Registry};
    let filter = |log: Option<&str>| {
        EnvFilter::try_new(log.unwrap_or(DEFAULT_LOG)).unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG))
    };
    let (log_filter, handle) = reload::Layer::new(filter(log));
    let json = std::env::var("HERALD_LOG_FORMAT").is_ok_and(|v| v == "json");
    // Logs go to stderr; stdout carries only the connect banner.
    let fmt = tracing_subscriber::fmt::layer().with_target(false).with_writer(std::io::stderr);
    let fmt: Box<dyn Layer<Registry> + Send + Sync> = if json { fmt.json().boxed() } else { fmt.boxed() };
    let (otel, traces) = match otel::layer() {
        Ok(Some((layer, traces))) => (Some(layer), Some(traces)),
        Ok(None) => (None, None),
        Err(e) => {
            eprintln!("herald: traces are off: {e}");
            (None, None)
        }
    };
    tracing_subscriber::registry().with(fmt.with_filter(log_filter)).with(otel).init();
    if traces.is_some() {
        tracing::info!("traces: exporting over OTLP (OTEL_EXPORTER_OTLP_ENDPOINT)");
    }
    let reload: herald_server::reload::LogFilter = Box::new(move |log| {
        let _ = handle.reload(filter(log));
    });
    (reload, traces)
}

async fn serve(
    config: herald_server::Config,
    flags: ServeFlags,
    log_filter: herald_server::reload::LogFilter,
) -> anyhow::Result<()> {
    let engine = open_engine(&config).await?;
    let dev = config.dev;
    let console = config.console_enabled();
    let no_keys = config.api_keys.is_empty();
    let storage = match config.engine {
        EngineKind::Embedded => format!("embedded in {}", config.data_dir.display()),
        EngineKind::Redis => "redis".to_owned(),
    };
    let server = Server::bind(config, engine).await.map_err(|e| anyhow::anyhow!("cannot listen: {e}"))?;
    let addr = server.local_addr();
    if dev {
        tracing::warn!("DEV MODE: token-less connections and key-less API calls are accepted. INSECURE: never expose this server.");
    }
    if no_keys && !dev {
        tracing::warn!("no API keys configured: the HTTP API refuses every request (set HERALD_API_KEYS)");
    }
    tracing::info!(
        listen = %addr,
        storage = %storage,
        max_connections = server.state().max_connections,
        max_http_connections = server.state().max_http_connections,
        "herald is serving"
    );
    println!("herald listening on http://{addr}");
    if dev {
        println!("  WARNING: --dev mode: no authentication. INSECURE, for local trial only.");
    }
    if console {
        println!("  console:   http://{addr}/console/");
    }
    println!("  publish:   curl -X POST http://{addr}/api/v1/channels/chat:demo/messages -H 'content-type: application/json' -d '{{\"data\":{{\"text\":\"hi\"}}}}'");
    if dev {
        println!("  subscribe: ws://{addr}/ws?user=alice   (or: herald tail chat:demo --url http://{addr} --user alice)");
    } else {
        println!("  subscribe: ws://{addr}/ws with Authorization: Bearer <JWT>");
    }
    // A reload reads the configuration as the start did: the same file, and
    // the same flags and environment over it.
    server.set_log_filter(log_filter);
    server.set_reloader(Box::new(move || {
        config_load::load(&flags).map(|l| l.config).map_err(|e| format!("invalid configuration: {e}"))
    }));
    #[cfg(unix)]
    {
        let state = server.state().clone();
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(mut hup) => {
                tokio::spawn(async move {
                    while hup.recv().await.is_some() {
                        tracing::info!("SIGHUP: reloading the configuration");
                        let state = state.clone();
                        // Logged and counted by `reload` itself.
                        let _ = tokio::task::spawn_blocking(move || state.reload()).await;
                    }
                });
            }
            Err(e) => tracing::warn!(error = %e, "cannot listen for SIGHUP: no reload by signal"),
        }
    }
    // The first SIGTERM (or Ctrl-C) drains and shuts down; a second one
    // closes what the drain has not closed yet at once.
    let state = server.state().clone();
    let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = first_tx.send(());
        shutdown_signal().await;
        tracing::info!("second signal: closing the remaining connections at once");
        state.sessions.hurry();
    });
    server
        .run(async move {
            let _ = first_rx.await;
        })
        .await?;
    Ok(())
}

async fn open_engine(config: &herald_server::Config) -> anyhow::Result<Arc<dyn herald_core::Engine>> {
    Ok(match config.engine {
        EngineKind::Embedded => {
            let store = StoreConfig::with_settings(&config.data_dir, &config.storage);
            let engine = EmbeddedEngine::open(store).map_err(|e| {
                anyhow::anyhow!("cannot open the data dir {}: {e}", config.data_dir.display())
            })?;
            Arc::new(engine)
        }
        EngineKind::Redis => {
            let redis = herald_redis::RedisConfig::with_settings(&config.redis);
            Arc::new(herald_redis::RedisEngine::open(redis).await?)
        }
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("signal received");
}
