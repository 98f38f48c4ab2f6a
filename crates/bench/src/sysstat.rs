//! Figures read from outside a process: RSS and CPU time from `/proc/<pid>`, and Prometheus
//! `/metrics` scrapes (docs/benchmarking.md rule 7: a second, independent measurement).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One sample of a process: resident memory and CPU time used so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcSample {
    /// Resident set size, bytes (`VmRSS`).
    pub rss_bytes: u64,
    /// User + system CPU time, seconds.
    pub cpu_s: f64,
    /// Of which system (kernel) time, seconds.
    #[serde(default)]
    pub system_s: f64,
}

/// Clock ticks per second for `/proc/<pid>/stat` (`getconf CLK_TCK`, 100 on Linux x86-64).
fn clk_tck() -> f64 {
    static TCK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TCK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Samples `/proc/<pid>` (`pid` 0 means this process). `None` if the process is gone.
pub fn sample(pid: u32) -> Option<ProcSample> {
    let dir = if pid == 0 {
        "self".to_string()
    } else {
        pid.to_string()
    };
    let status = std::fs::read_to_string(format!("/proc/{dir}/status")).ok()?;
    let rss_kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let stat = std::fs::read_to_string(format!("/proc/{dir}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let after = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some(ProcSample {
        rss_bytes: rss_kb * 1024,
        cpu_s: (utime + stime) / clk_tck(),
        system_s: stime / clk_tck(),
    })
}

/// CPU use between two samples over `wall_s` seconds, in percent of one core.
pub fn cpu_pct(a: &ProcSample, b: &ProcSample, wall_s: f64) -> f64 {
    if wall_s <= 0.0 {
        0.0
    } else {
        100.0 * (b.cpu_s - a.cpu_s) / wall_s
    }
}

/// Kernel CPU use between two samples over `wall_s` seconds, in percent of one core.
pub fn system_pct(a: &ProcSample, b: &ProcSample, wall_s: f64) -> f64 {
    if wall_s <= 0.0 {
        0.0
    } else {
        100.0 * (b.system_s - a.system_s) / wall_s
    }
}

/// Whole-machine CPU counters from `/proc/stat` (all cores), in clock ticks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineSample {
    /// user, nice, system, idle, iowait, irq, softirq, steal.
    pub ticks: [u64; 8],
    /// 1-minute load average.
    pub loadavg: f64,
}

/// Samples `/proc/stat` and `/proc/loadavg`.
pub fn machine() -> MachineSample {
    let mut m = MachineSample::default();
    if let Ok(stat) = std::fs::read_to_string("/proc/stat") {
        if let Some(line) = stat.lines().find(|l| l.starts_with("cpu ")) {
            for (i, v) in line.split_whitespace().skip(1).take(8).enumerate() {
                m.ticks[i] = v.parse().unwrap_or(0);
            }
        }
    }
    m.loadavg = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0);
    m
}

/// How the machine's CPU time was spent between two samples, in percent of all cores.
///
/// `nice` is other people's niced work (builds) sharing the machine; `softirq` is loopback TCP
/// processing that the kernel may not charge to the server or the rig.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineCpu {
    /// Number of cores.
    pub cores: usize,
    /// Load average (1 min) at the start of the window.
    pub loadavg_start: f64,
    /// Load average (1 min) at the end of the window.
    pub loadavg_end: f64,
    /// User time, %.
    pub user: f64,
    /// Niced user time, %.
    pub nice: f64,
    /// System time, %.
    pub system: f64,
    /// Soft interrupts, %.
    pub softirq: f64,
    /// Idle, %.
    pub idle: f64,
    /// Everything else (iowait, irq, steal), %.
    pub other: f64,
}

/// The breakdown between two [`machine`] samples.
pub fn machine_cpu(a: &MachineSample, b: &MachineSample) -> MachineCpu {
    let d: Vec<f64> = (0..8)
        .map(|i| b.ticks[i].saturating_sub(a.ticks[i]) as f64)
        .collect();
    let total: f64 = d.iter().sum::<f64>().max(1.0);
    let pct = |v: f64| 100.0 * v / total;
    MachineCpu {
        cores: std::fs::read_to_string("/proc/stat")
            .map(|s| {
                s.lines()
                    .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
                    .count()
            })
            .unwrap_or(0),
        loadavg_start: a.loadavg,
        loadavg_end: b.loadavg,
        user: pct(d[0]),
        nice: pct(d[1]),
        system: pct(d[2]),
        idle: pct(d[3]),
        softirq: pct(d[6]),
        other: pct(d[4] + d[5] + d[7]),
    }
}

/// A parsed Prometheus text exposition: `name{labels}` → value.
pub type Metrics = BTreeMap<String, f64>;

/// Parses Prometheus text format (comments skipped; the series key keeps its labels).
pub fn parse_metrics(text: &str) -> Metrics {
    let mut m = Metrics::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // The value follows the series key (which may contain spaces inside label values).
        let key_end = match line.find('}') {
            Some(i) => i + 1,
            None => line.find(' ').unwrap_or(line.len()),
        };
        let (key, rest) = line.split_at(key_end);
        if let Some(v) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        {
            m.insert(key.trim().to_string(), v);
        }
    }
    m
}

/// Sum of every series of metric `name` (all label sets).
pub fn metric_sum(m: &Metrics, name: &str) -> Option<f64> {
    let mut found = false;
    let mut sum = 0.0;
    for (k, v) in m {
        let base = k.split('{').next().unwrap_or(k);
        if base == name {
            found = true;
            sum += v;
        }
    }
    found.then_some(sum)
}

/// Series that changed between two scrapes, with their difference.
pub fn metrics_delta(before: &Metrics, after: &Metrics) -> Metrics {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0.0);
            (d != 0.0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Scrapes `GET base/metrics`; `None` when the node does not answer.
pub async fn scrape(base: &str) -> Option<Metrics> {
    let r = crate::http::get(base, "/metrics").await.ok()?;
    (r.status == 200).then(|| parse_metrics(&String::from_utf8_lossy(&r.body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_prometheus_text() {
        let m = parse_metrics(
            "# HELP x y\n# TYPE a counter\na_total 3\nb{node=\"n 1\",k=\"v\"} 4.5\nb{node=\"n2\"} 1\nc 1e3\n",
        );
        assert_eq!(m["a_total"], 3.0);
        assert_eq!(metric_sum(&m, "b"), Some(5.5));
        assert_eq!(m["c"], 1000.0);
        assert_eq!(metric_sum(&m, "zzz"), None);
        let mut m2 = m.clone();
        m2.insert("a_total".into(), 10.0);
        assert_eq!(metrics_delta(&m, &m2)["a_total"], 7.0);
    }

    #[test]
    fn samples_this_process() {
        // Some kernel time first: a file written and read back a few hundred times.
        let path = std::env::temp_dir().join(format!("herald-bench-sys-{}", std::process::id()));
        for _ in 0..300 {
            std::fs::write(&path, [0u8; 4096]).unwrap();
            let _ = std::fs::read(&path).unwrap();
        }
        let _ = std::fs::remove_file(&path);
        let s = sample(0).unwrap();
        assert!(s.rss_bytes > 0);
        assert!(s.system_s <= s.cpu_s, "{s:?}");
        let none = ProcSample::default();
        assert!(system_pct(&none, &s, 1.0) <= cpu_pct(&none, &s, 1.0));
    }
}
