//! A `herald serve` process, for tests that must kill it (`kill -9`),
//! freeze it (SIGSTOP) or run it in a network namespace. The caller builds
//! the command line (the binary is `env!("CARGO_BIN_EXE_herald")`, known
//! only to the binary crate's tests); this starts it and owns it.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use tempfile::TempDir;

use herald_redis::testing::signal;

/// A running `herald serve` process. Killed on drop (after a SIGCONT, in
/// case it was stopped).
pub struct HeraldProcess {
    child: Child,
    /// `http://IP:PORT`, from its first line on stdout.
    pub url: String,
    pub pid: u32,
    dir: Option<TempDir>,
}

impl HeraldProcess {
    /// Run `cmd` with stdout piped, and wait for its first line, `herald
    /// listening on URL`; stdout is drained from then on, so the process
    /// never blocks on a full pipe. `dir` (its config, its data, its log)
    /// is kept as long as the process; a log the caller sent to
    /// [`Self::log_path`] in it is shown if the process does not start.
    /// SIGTERM closes every session at once (`HERALD_DRAIN_PERIOD=0s`)
    /// unless the caller set a drain period.
    pub fn spawn(cmd: &mut Command, dir: Option<TempDir>) -> Self {
        if !cmd.get_envs().any(|(k, _)| k == "HERALD_DRAIN_PERIOD") {
            cmd.env("HERALD_DRAIN_PERIOD", "0s");
        }
        let child = cmd.env_remove("HERALD_CONFIG").stdin(Stdio::null()).stdout(Stdio::piped()).spawn();
        let child = child.expect("spawn herald");
        // Owned by the guard first, so a failed read below still kills it.
        let mut proc = HeraldProcess { pid: child.id(), child, url: String::new(), dir };
        let stdout = proc.child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let Some(Ok(first)) = lines.next() else {
            panic!("herald did not start:\n{}", proc.log());
        };
        proc.url = first.strip_prefix("herald listening on ").expect("listening line").trim().to_owned();
        std::thread::spawn(move || for _ in lines {});
        proc
    }

    pub fn sigstop(&self) {
        signal(self.pid, "STOP");
    }

    pub fn sigcont(&self) {
        signal(self.pid, "CONT");
    }

    /// Wait, at most [`WAIT`](crate::WAIT), for the process to exit by
    /// itself (after a SIGTERM): its status.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + crate::WAIT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(std::time::Instant::now() < deadline, "herald did not exit in time:\n{}", self.log());
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("reap");
    }

    /// Where in `dir` a process's stderr goes, for [`Self::log`].
    pub fn log_path(dir: &TempDir) -> PathBuf {
        dir.path().join("herald.log")
    }

    /// Its log so far (stderr), if it went to [`Self::log_path`].
    pub fn log(&self) -> String {
        let path = self.dir.as_ref().map(Self::log_path);
        path.and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default()
    }
}

impl Drop for HeraldProcess {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-CONT", &self.pid.to_string()]).stderr(Stdio::null()).status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
