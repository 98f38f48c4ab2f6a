//! Figures read from outside a process: RSS and CPU time from `/proc/<pid>`, and Prometheus
//! `/metrics` scrapes (BENCHMARKS.md rule 7: a second, independent measurement).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One sample of a process: resident memory and CPU time used so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcSample {
    /// Resident set size, bytes (`VmRSS`).
    pub rss_bytes: u64,
    /// User + system CPU time, seconds.
    pub cpu_s: f64,
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
        let s = sample(0).unwrap();
        assert!(s.rss_bytes > 0);
    }
}
