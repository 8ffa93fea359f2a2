//! Server memory and CPU from `/proc/PID` (Linux), and a description of the
//! machine for the report.

use std::time::Instant;

use anyhow::{bail, Context};
use serde::Serialize;

/// One reading of a process.
#[derive(Debug, Clone, Copy)]
pub struct ProcSample {
    /// `VmRSS` from `/proc/PID/status`.
    pub rss_kb: u64,
    /// `utime + stime` from `/proc/PID/stat`, in clock ticks.
    pub cpu_ticks: u64,
    /// `stime` alone: the kernel's share (system calls, the network stack
    /// a loopback send runs through, page faults).
    pub sys_ticks: u64,
    pub at: Instant,
}

pub fn sample(pid: u32) -> anyhow::Result<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status (is --server-pid right?)"))?;
    let rss_kb = status_field_kb(&status, "VmRSS:").context("no VmRSS in /proc/PID/status")?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read /proc/{pid}/stat"))?;
    let (utime, stime) = stat_cpu_ticks(&stat)?;
    Ok(ProcSample { rss_kb, cpu_ticks: utime + stime, sys_ticks: stime, at: Instant::now() })
}

/// Optional sampling: `None` when no server pid was given.
pub fn maybe_sample(pid: Option<u32>) -> anyhow::Result<Option<ProcSample>> {
    pid.map(sample).transpose()
}

/// CPU use between two samples, in percent of one core (200 % = two cores
/// busy).
pub fn cpu_pct(a: &ProcSample, b: &ProcSample) -> f64 {
    ticks_pct(b.cpu_ticks.saturating_sub(a.cpu_ticks), a, b)
}

/// The kernel's share of [`cpu_pct`] (`stime` alone).
pub fn sys_pct(a: &ProcSample, b: &ProcSample) -> f64 {
    ticks_pct(b.sys_ticks.saturating_sub(a.sys_ticks), a, b)
}

fn ticks_pct(ticks: u64, a: &ProcSample, b: &ProcSample) -> f64 {
    let secs = b.at.duration_since(a.at).as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    ticks as f64 / clock_ticks_per_sec() / secs * 100.0
}

pub fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions; it only reads a constant.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

fn status_field_kb(status: &str, name: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(name))?;
    line[name.len()..].split_whitespace().next()?.parse().ok()
}

/// `utime` and `stime` are fields 14 and 15 of `/proc/PID/stat`; the command
/// name (field 2) may contain spaces and parentheses, so count from the last
/// `)`.
fn stat_cpu_ticks(stat: &str) -> anyhow::Result<(u64, u64)> {
    let Some(end) = stat.rfind(')') else { bail!("malformed /proc/PID/stat") };
    let fields: Vec<&str> = stat[end + 1..].split_whitespace().collect();
    // fields[0] is field 3 (state), so field N is fields[N - 3].
    let utime: u64 = fields.get(11).and_then(|f| f.parse().ok()).context("no utime in /proc/PID/stat")?;
    let stime: u64 = fields.get(12).and_then(|f| f.parse().ok()).context("no stime in /proc/PID/stat")?;
    Ok((utime, stime))
}

/// Busy time of the whole machine (all CPUs) from `/proc/stat`, in clock
/// ticks: everything but idle and iowait.
pub fn machine_busy_ticks() -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
    let line = stat.lines().next().filter(|l| l.starts_with("cpu ")).context("no cpu line in /proc/stat")?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user)
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    Ok(get(0) + get(1) + get(2) + get(5) + get(6) + get(7))
}

/// Server, client and whole-machine CPU at one moment; two of them make a
/// measurement window.
#[derive(Debug, Clone, Copy)]
pub struct CpuSnapshot {
    pub server: Option<ProcSample>,
    pub client: Option<ProcSample>,
    machine_ticks: u64,
    at: Instant,
}

/// CPU use over a window, each in % of one core.
#[derive(Debug, Clone, Copy)]
pub struct CpuWindow {
    pub server_pct: Option<f64>,
    /// The kernel's part of `server_pct`.
    pub server_sys_pct: Option<f64>,
    pub client_pct: Option<f64>,
    /// Everything else on the machine: other processes competing for the
    /// cores. A large value means the run was disturbed.
    pub other_pct: f64,
}

impl CpuSnapshot {
    pub fn take(server_pid: Option<u32>, client: Option<ProcSample>) -> anyhow::Result<Self> {
        Ok(CpuSnapshot {
            server: maybe_sample(server_pid)?,
            client,
            machine_ticks: machine_busy_ticks()?,
            at: Instant::now(),
        })
    }

    pub fn window(&self, later: &CpuSnapshot) -> CpuWindow {
        let pct = |f: fn(&ProcSample, &ProcSample) -> f64, a: &Option<ProcSample>, b: &Option<ProcSample>| {
            Some(f(a.as_ref()?, b.as_ref()?))
        };
        let server_pct = pct(cpu_pct, &self.server, &later.server);
        let server_sys_pct = pct(sys_pct, &self.server, &later.server);
        let client_pct = pct(cpu_pct, &self.client, &later.client);
        let secs = later.at.duration_since(self.at).as_secs_f64().max(1e-9);
        let machine =
            later.machine_ticks.saturating_sub(self.machine_ticks) as f64 / clock_ticks_per_sec() / secs
                * 100.0;
        let other_pct = (machine - server_pct.unwrap_or(0.0) - client_pct.unwrap_or(0.0)).max(0.0);
        CpuWindow { server_pct, server_sys_pct, client_pct, other_pct }
    }
}

/// Raise this process's soft open-files limit to the hard limit.
pub fn raise_nofile() -> u64 {
    rlimit::increase_nofile_limit(u64::MAX).unwrap_or(1024)
}

/// What the report says about the machine.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    pub cpus: usize,
    pub mem_total_kb: Option<u64>,
    pub kernel: Option<String>,
    pub cpu_model: Option<String>,
}

impl Machine {
    pub fn describe() -> Machine {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Machine {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            mem_total_kb: status_field_kb(&meminfo, "MemTotal:"),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_owned()),
            cpu_model: cpuinfo
                .lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_command_names() {
        let stat =
            "1234 (my (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 4 0 100 1000 50";
        assert_eq!(stat_cpu_ticks(stat).unwrap(), (250, 75));
        assert!(stat_cpu_ticks("garbage").is_err());
    }

    #[test]
    fn machine_window_is_non_negative() {
        let a = CpuSnapshot::take(Some(std::process::id()), None).unwrap();
        let b = CpuSnapshot::take(Some(std::process::id()), None).unwrap();
        let w = a.window(&b);
        assert!(w.other_pct >= 0.0 && w.server_pct.is_some() && w.client_pct.is_none());
        assert!(w.server_sys_pct.unwrap() <= w.server_pct.unwrap());
    }

    #[test]
    fn reads_this_process() {
        let s = sample(std::process::id()).unwrap();
        assert!(s.rss_kb > 0);
        assert_eq!(status_field_kb("VmRSS:\t  1234 kB\n", "VmRSS:"), Some(1234));
    }
}
