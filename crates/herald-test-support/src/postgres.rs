//! A PostgreSQL server for tests: `initdb` and `pg_ctl` in a temp dir on a
//! free port (as the `postgres` user when the tests run as root, which
//! PostgreSQL refuses to be), stopped at once on drop. Every test starts
//! its own; none touches a shared one.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// One PostgreSQL cluster: `fsync = off` (a test's data need not survive
/// the machine), trust authentication on 127.0.0.1 only.
pub struct PostgresServer {
    pub port: u16,
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// `(uid, gid)` of `postgres` when running as root.
    user: Option<(u32, u32)>,
    running: bool,
}

/// The directory holding `initdb` and `pg_ctl`: `$HERALD_PG_BIN`, the
/// newest `/usr/lib/postgresql/*/bin`, or `PATH`.
fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("HERALD_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, p): &(u32, PathBuf)| p.join("pg_ctl").exists())
        .collect();
    versions.sort();
    versions.pop().map(|(_, p)| p).unwrap_or_default()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// The `postgres` user's ids, when this process is root.
fn postgres_user() -> Option<(u32, u32)> {
    let id = |args: &[&str]| -> u32 {
        let out = Command::new("id").args(args).output().expect("run id");
        assert!(out.status.success(), "running as root needs a `postgres` user for PostgreSQL");
        String::from_utf8_lossy(&out.stdout).trim().parse().expect("numeric id")
    };
    if id(&["-u"]) != 0 {
        return None;
    }
    Some((id(&["-u", "postgres"]), id(&["-g", "postgres"])))
}

impl PostgresServer {
    /// initdb and start; panics with the log if it cannot.
    pub fn start() -> Self {
        let bin = bin_dir();
        let dir = tempfile::tempdir().expect("temp dir");
        let user = postgres_user();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).expect("chown the temp dir");
        }
        let mut s = PostgresServer { port: free_port(), dir, bin, user, running: false };
        let out = s.run(
            "initdb",
            &["-D", &s.data().to_string_lossy(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"],
        );
        assert!(
            out.status.success(),
            "initdb failed (install PostgreSQL: apt-get install postgresql, or run scripts/test): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let conf = "fsync = off\nfull_page_writes = off\nmax_connections = 200\n";
        let path = s.data().join("postgresql.conf");
        let mut text = std::fs::read_to_string(&path).expect("postgresql.conf");
        text.push_str(conf);
        std::fs::write(&path, text).expect("write postgresql.conf");
        s.spawn();
        s
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn run(&self, tool: &str, args: &[&str]) -> Output {
        let mut cmd = Command::new(self.bin.join(tool));
        cmd.args(args).stdin(Stdio::null()).current_dir(self.dir.path());
        if let Some((uid, gid)) = self.user {
            cmd.uid(uid).gid(gid);
        }
        cmd.output().unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}); install PostgreSQL (apt-get install postgresql) or run scripts/test",
                self.bin.join(tool).display()
            )
        })
    }

    fn spawn(&mut self) {
        let opts = format!("-p {} -c listen_addresses=127.0.0.1 -k {}", self.port, self.dir.path().display());
        let log = self.dir.path().join("postgres.log");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = self.run(
                "pg_ctl",
                &[
                    "-D",
                    &self.data().to_string_lossy(),
                    "-l",
                    &log.to_string_lossy(),
                    "-o",
                    &opts,
                    "-w",
                    "-t",
                    "20",
                    "start",
                ],
            );
            if out.status.success() {
                self.running = true;
                return;
            }
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(Instant::now() < deadline, "PostgreSQL did not start: {text}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `host=127.0.0.1 port=P user=postgres dbname=postgres`.
    pub fn dsn(&self) -> String {
        format!("host=127.0.0.1 port={} user=postgres dbname=postgres", self.port)
    }

    /// Stop at once (`pg_ctl stop -m immediate`: every backend killed, the
    /// WAL replayed at the next start, as after a crash).
    pub fn stop(&mut self) {
        if self.running {
            let _ =
                self.run("pg_ctl", &["-D", &self.data().to_string_lossy(), "-m", "immediate", "-w", "stop"]);
            self.running = false;
        }
    }

    /// Stop at once and start again on the same port and data.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A client connection; its connection task runs on the current runtime.
    pub async fn connect(&self) -> tokio_postgres::Client {
        connect(&self.dsn()).await
    }
}

/// Connect to `dsn` (retrying for a few seconds while the server starts).
pub async fn connect(dsn: &str) -> tokio_postgres::Client {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match tokio_postgres::connect(dsn, tokio_postgres::NoTls).await {
            Ok((client, conn)) => {
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                return client;
            }
            Err(e) if Instant::now() > deadline => panic!("cannot connect to PostgreSQL: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.stop();
    }
}
