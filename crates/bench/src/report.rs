//! Output: the human table on stdout, the JSON file with parameters and raw results, and a
//! self-contained HTML (or SVG) report with the latency-percentile and throughput charts.

use std::fmt::Write as _;

use crate::coordinator::RunResult;
use crate::hist::Summary;

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

fn kb(b: f64) -> String {
    format!("{:.2} KB", b / 1024.0)
}

fn mb(b: u64) -> String {
    format!("{:.1} MB", b as f64 / (1024.0 * 1024.0))
}

fn lat_row(name: &str, s: &Summary) -> String {
    format!(
        "{name:<26} n={} p50={} p90={} p99={} p99.9={} max={} ms\n",
        s.count,
        ms(s.p50),
        ms(s.p90),
        ms(s.p99),
        ms(s.p999),
        ms(s.max)
    )
}

/// The human-readable table of one run.
pub fn table(r: &RunResult) -> String {
    let mut o = String::new();
    let p = r.params.as_ref();
    let _ = writeln!(
        o,
        "== herald-bench {}: {} connections, {} workers ==",
        r.scenario, r.connections, r.workers
    );
    if let Some(p) = p {
        let _ = writeln!(
            o,
            "{:<26} channels={} rate={}/s duration={}s payload={}B ws={:?} transport={}{}{}",
            "parameters",
            p.channels,
            p.rate,
            p.duration,
            p.payload,
            p.ws_urls,
            match p.transport {
                crate::params::Transport::Ws => "ws",
                crate::params::Transport::Sse => "sse",
            },
            if p.compression {
                " compression offered"
            } else {
                ""
            },
            match (p.pusher, p.centrifugo) {
                (true, _) if p.pusher_app.is_some() => " protocol=pusher-plain",
                (true, _) => " protocol=pusher",
                (_, true) => " protocol=centrifugo",
                _ if p.socketio => " protocol=socketio",
                _ => "",
            }
        );
    }
    let _ = writeln!(
        o,
        "{:<26} {} subscribed, {} failed, {:.1} s, {:.0} conn/s",
        "connect", r.connected, r.failed, r.connect_s, r.connect_rate
    );
    o.push_str(&lat_row("connect+subscribe latency", &r.connect_latency));
    for s in &r.servers {
        let _ = writeln!(
            o,
            "{:<26} pid {}: RSS {} → {} (connected) → {} (end); CPU {:.0}% window (kernel {:.0}%), {:.0}% connect",
            "server",
            s.pid,
            mb(s.rss_before),
            mb(s.rss_connected),
            mb(s.rss_end),
            s.cpu_pct,
            s.system_pct,
            s.connect_cpu_pct
        );
    }
    if let Some(b) = r.broker_cpu_pct {
        let nodes: f64 = r.servers.iter().map(|s| s.cpu_pct).sum();
        let _ = writeln!(
            o,
            "{:<26} {:.0}% window (pids {:?}); nodes + broker {:.0}%{}",
            "broker CPU",
            b,
            r.params
                .as_ref()
                .map(|p| p.broker_pids.clone())
                .unwrap_or_default(),
            nodes + b,
            per_thousand(nodes + b, r.deliveries_per_s)
        );
    }
    for (i, m) in r.metrics_connected_delta.iter().enumerate() {
        // Herald's gauges, or a Centrifugo node's (`--centrifugo`).
        let g = |keys: &[&str]| {
            keys.iter()
                .find_map(|k| m.get(*k))
                .map_or("n/a".to_string(), |v| format!("{v:.0}"))
        };
        let _ = writeln!(
            o,
            "{:<26} node {i}: +{} connections, +{} subscriptions (server's /metrics when all were connected)",
            "server-side count",
            g(&["herald_connections", "centrifugo_node_num_clients"]),
            g(&["herald_subscriptions", "centrifugo_node_num_subscriptions"])
        );
    }
    for (i, m) in r.metrics_delta.iter().enumerate() {
        if let Some(tls) = m.get("herald_tls_handshakes_total") {
            let resumed = m.get("herald_tls_resumed_total").copied().unwrap_or(0.0);
            let _ = writeln!(
                o,
                "{:<26} node {i}: {tls:.0} TLS handshakes, {resumed:.0} of them resumed with a ticket (server's /metrics, whole run)",
                "server-side TLS",
            );
        }
    }
    if r.rss_per_connection != 0.0 {
        let _ = writeln!(
            o,
            "{:<26} {}",
            "server RSS / connection",
            kb(r.rss_per_connection)
        );
    }
    let _ = writeln!(
        o,
        "{:<26} coordinator {:.0}%, workers {:.0}% (of one core), workers RSS {}",
        "rig CPU",
        r.rig_cpu_pct.coordinator,
        r.rig_cpu_pct.workers,
        mb(r.rig_cpu_pct.workers_rss)
    );
    let m = &r.machine;
    let _ = writeln!(
        o,
        "{:<26} {} cores: user {:.0}%, system {:.0}%, softirq {:.0}%, nice (others) {:.0}%, idle {:.0}%; load {:.1}",
        "machine CPU (window)", m.cores, m.user, m.system, m.softirq, m.nice, m.idle, m.loadavg_start
    );
    if r.publish.scheduled > 0 {
        let _ = writeln!(
            o,
            "{:<26} {} scheduled, {} ok, {} errors over {:.1} s",
            "publish",
            r.publish.scheduled,
            r.publish.ok,
            r.publish.errors.values().sum::<u64>(),
            r.publish.window_s
        );
        o.push_str(&lat_row("publish API latency", &r.publish.api_latency));
        let d = &r.delivery;
        let _ = writeln!(
            o,
            "{:<26} {:.4}% ({} of {}), missing {}, duplicates {}, gaps {}, out-of-order {}",
            "delivered",
            r.delivered_pct,
            d.delivered,
            d.expected,
            d.missing,
            d.counts.duplicates,
            d.counts.gap_events,
            d.counts.out_of_order
        );
        let _ = writeln!(
            o,
            "{:<26} {:.0} mean over window, {:.0} median second, {:.0} lowest second",
            "deliveries/s", r.deliveries_per_s, r.deliveries_per_s_median, r.deliveries_per_s_min
        );
        o.push_str(&lat_row("delivery latency", &r.latency));
        o.push_str(&lat_row("publication reached all", &r.reach_all));
    }
    let c = &r.counters;
    if c.reconnects > 0 || c.client_drops > 0 {
        let _ = writeln!(
            o,
            "{:<26} drops {}, reconnects {}, recovered {}, not recovered {}, epoch changes {}, failed attempts retried {}",
            "reconnects",
            c.client_drops,
            c.reconnects,
            c.recovered,
            c.not_recovered,
            c.epoch_changes,
            c.retried_attempts
        );
        o.push_str(&lat_row("reconnect → recovered", &r.recovery));
    }
    if let Some(s) = &r.storm {
        let _ = writeln!(
            o,
            "{:<26} {} dropped, {} back; 95% back in {:.0} ms, 100% in {:.0} ms",
            r.scenario, s.dropped, s.back, s.p95_ms, s.p100_ms
        );
    }
    if let Some(t) = r.restart_s {
        let _ = writeln!(
            o,
            "{:<26} SIGTERM → restarted node healthy in {:.2} s (times above count from the SIGTERM)",
            "restart", t
        );
    }
    for b in &r.broker {
        let _ = writeln!(
            o,
            "{:<26} node {}: received {} vs ideal {}",
            "broker messages",
            b.node,
            b.received
                .map_or("n/a (metric not exposed)".into(), |v| format!("{v:.0}")),
            b.ideal
        );
    }
    if p.is_some_and(|p| p.compression) {
        let _ = writeln!(
            o,
            "{:<26} {} of {} connections negotiated permessage-deflate",
            "compression", c.compressed, r.connected
        );
    }
    let _ = writeln!(
        o,
        "{:<26} pings {}, join {}, leave {}, disconnect pushes {}, server closes {}, error replies {}, parse errors {}",
        "events", c.pings, c.joins, c.leaves, c.disconnect_pushes, c.server_closes, c.error_replies, c.parse_errors
    );
    for s in &r.stopped_by {
        let _ = writeln!(o, "{:<26} {s}", "stopped by / limits");
    }
    o
}

/// The one figure the self-check compares for a scenario, with its unit.
pub fn headline(r: &RunResult) -> Vec<(String, f64)> {
    match r.scenario.as_str() {
        "idle" => vec![
            (
                "server RSS/connection (KB)".into(),
                r.rss_per_connection / 1024.0,
            ),
            ("connect rate (/s)".into(), r.connect_rate),
        ],
        "storm" | "drain" => {
            let s = r.storm.clone().unwrap_or_default();
            vec![
                ("95% back (ms)".into(), s.p95_ms),
                ("100% back (ms)".into(), s.p100_ms),
            ]
        }
        "jitter" => vec![
            ("delivered %".into(), r.delivered_pct),
            ("duplicates".into(), r.delivery.counts.duplicates as f64),
            ("p99 (ms)".into(), r.latency.p99 as f64 / 1000.0),
        ],
        _ => vec![
            ("delivered %".into(), r.delivered_pct),
            ("deliveries/s".into(), r.deliveries_per_s),
            ("p50 (ms)".into(), r.latency.p50 as f64 / 1000.0),
            ("p99 (ms)".into(), r.latency.p99 as f64 / 1000.0),
            (
                "server CPU %".into(),
                r.servers.iter().map(|s| s.cpu_pct).sum(),
            ),
        ],
    }
}

/// Side-by-side headline figures of the self-check runs (W and 2W workers).
pub fn self_check_table(runs: &[RunResult]) -> String {
    let mut o = String::from(
        "== self-check (docs/benchmarking.md rule 2): same load, twice the worker processes ==\n",
    );
    let _ = write!(o, "{:<30}", "figure");
    for r in runs {
        let _ = write!(o, "{:>16}", format!("{} workers", r.workers));
    }
    o.push_str("      change\n");
    let heads: Vec<_> = runs.iter().map(headline).collect();
    for (i, (name, _)) in heads[0].iter().enumerate() {
        let _ = write!(o, "{name:<30}");
        for h in &heads {
            let _ = write!(o, "{:>16.3}", h[i].1);
        }
        let (a, b) = (heads[0][i].1, heads[heads.len() - 1][i].1);
        let ch = if a != 0.0 { 100.0 * (b - a) / a } else { 0.0 };
        let _ = writeln!(o, "{ch:>+11.1}%");
    }
    o
}

const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

/// Latency percentile spectrum (x: 0, 90, 99, 99.9 … on a log "nines" scale; y: ms).
pub fn latency_svg(runs: &[RunResult], title: &str) -> String {
    let (w, h, l, b) = (640.0, 300.0, 60.0, 40.0);
    let x_of = |p: f64| -> f64 {
        let nines = if p >= 100.0 {
            5.5
        } else {
            (-(1.0 - p / 100.0).log10()).min(5.0)
        };
        l + nines / 5.5 * (w - l - 20.0)
    };
    let ymax = runs
        .iter()
        .flat_map(|r| r.latency_spectrum.iter().map(|x| x.1))
        .max()
        .unwrap_or(1)
        .max(1) as f64
        / 1000.0
        * 1.1;
    let y_of = |v: f64| h - b - v / ymax * (h - b - 30.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\
<rect width=\"100%\" height=\"100%\" fill=\"white\"/><text x=\"{l}\" y=\"16\" font-size=\"13\">{title}: delivery latency by percentile (ms)</text>"
    );
    for (p, label) in [
        (0.0, "0"),
        (90.0, "90"),
        (99.0, "99"),
        (99.9, "99.9"),
        (99.99, "99.99"),
        (99.999, "99.999"),
        (100.0, "max"),
    ] {
        let x = x_of(p);
        let _ = write!(
            s,
            "<line x1=\"{x:.1}\" y1=\"30\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#ddd\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{label}</text>",
            h - b,
            h - b + 14.0
        );
    }
    for i in 0..=4 {
        let v = ymax * i as f64 / 4.0;
        let y = y_of(v);
        let _ = write!(
            s,
            "<line x1=\"{l}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v:.1}</text>",
            w - 20.0,
            l - 4.0,
            y + 4.0
        );
    }
    let _ = write!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">percentile</text>",
        (w + l) / 2.0,
        h - 6.0
    );
    for (k, r) in runs.iter().enumerate() {
        let pts: Vec<String> = r
            .latency_spectrum
            .iter()
            .map(|(p, v)| format!("{:.1},{:.1}", x_of(*p), y_of(*v as f64 / 1000.0)))
            .collect();
        let c = COLORS[k % COLORS.len()];
        let _ = write!(
            s,
            "<polyline fill=\"none\" stroke=\"{c}\" stroke-width=\"2\" points=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"{c}\">{} workers: p99 {} ms</text>",
            pts.join(" "),
            l + 10.0,
            45.0 + 14.0 * k as f64,
            r.workers,
            ms(r.latency.p99)
        );
    }
    s.push_str("</svg>");
    s
}

/// Unique deliveries per second over the run (bars; one series per run, side by side).
pub fn throughput_svg(runs: &[RunResult], title: &str) -> String {
    let (w, h, l, b) = (640.0, 260.0, 70.0, 36.0);
    let n = runs
        .iter()
        .map(|r| r.timeline.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let ymax = runs
        .iter()
        .flat_map(|r| r.timeline.iter().copied())
        .max()
        .unwrap_or(1)
        .max(1) as f64
        * 1.1;
    let bw = (w - l - 20.0) / n as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\
<rect width=\"100%\" height=\"100%\" fill=\"white\"/><text x=\"{l}\" y=\"16\" font-size=\"13\">{title}: deliveries per second (s since start)</text>"
    );
    for i in 0..=4 {
        let v = ymax * i as f64 / 4.0;
        let y = h - b - v / ymax * (h - b - 30.0);
        let _ = write!(
            s,
            "<line x1=\"{l}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}</text>",
            w - 20.0,
            l - 4.0,
            y + 4.0
        );
    }
    let per = runs.len().max(1) as f64;
    for (k, r) in runs.iter().enumerate() {
        let c = COLORS[k % COLORS.len()];
        for (i, v) in r.timeline.iter().enumerate() {
            let bh = *v as f64 / ymax * (h - b - 30.0);
            let x = l + i as f64 * bw + k as f64 * bw / per;
            let _ = write!(
                s,
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.2}\" height=\"{bh:.1}\" fill=\"{c}\"/>",
                h - b - bh,
                (bw / per * 0.9).max(0.5)
            );
        }
    }
    let step = (n / 10).max(1);
    for i in (0..n).step_by(step) {
        let _ = write!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{i}</text>",
            l + (i as f64 + 0.5) * bw,
            h - b + 14.0
        );
    }
    s.push_str("</svg>");
    s
}

/// A self-contained HTML page: headline tables, parameters and both charts.
pub fn html(runs: &[RunResult]) -> String {
    let title = format!(
        "herald-bench {}",
        runs.first().map_or("", |r| r.scenario.as_str())
    );
    let mut o = format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{title}</title>\
<style>body{{font-family:sans-serif;max-width:980px;margin:20px auto}}pre{{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:12px}}</style></head><body><h1>{title}</h1>"
    );
    if runs.len() > 1 {
        let _ = write!(o, "<pre>{}</pre>", esc(&self_check_table(runs)));
    }
    for r in runs {
        let _ = write!(o, "<pre>{}</pre>", esc(&table(r)));
    }
    if runs.iter().any(|r| !r.latency_spectrum.is_empty()) {
        o.push_str(&latency_svg(runs, &title));
    }
    if runs.iter().any(|r| !r.timeline.is_empty()) {
        o.push_str(&throughput_svg(runs, &title));
    }
    if let Some(p) = runs.first().and_then(|r| r.params.as_ref()) {
        let _ = write!(
            o,
            "<h2>Parameters</h2><pre>{}</pre>",
            esc(&serde_json::to_string_pretty(p).unwrap_or_default())
        );
    }
    o.push_str("</body></html>\n");
    o
}

/// Both charts stacked in one SVG.
pub fn svg(runs: &[RunResult]) -> String {
    let title = format!(
        "herald-bench {}",
        runs.first().map_or("", |r| r.scenario.as_str())
    );
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"640\" height=\"570\"><g>{}</g><g transform=\"translate(0,305)\">{}</g></svg>\n",
        latency_svg(runs, &title),
        throughput_svg(runs, &title)
    )
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `, X% of a core per 1,000 deliveries/s` for a CPU share over the window, when anything was
/// delivered.
fn per_thousand(cpu_pct: f64, deliveries_per_s: f64) -> String {
    if deliveries_per_s > 0.0 {
        format!(
            ", {:.2}% of a core per 1,000 deliveries/s",
            cpu_pct / (deliveries_per_s / 1000.0)
        )
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::ServerFigures;

    #[test]
    fn cpu_per_thousand_deliveries() {
        // 90% of a core for 10,000 deliveries/s: 9% per 1,000/s.
        assert_eq!(
            per_thousand(90.0, 10_000.0),
            ", 9.00% of a core per 1,000 deliveries/s"
        );
        assert_eq!(per_thousand(90.0, 0.0), "");
    }

    #[test]
    fn broker_cpu_is_reported_apart_and_summed_with_the_nodes() {
        let mut r = RunResult {
            broker_cpu_pct: Some(30.0),
            deliveries_per_s: 10_000.0,
            ..Default::default()
        };
        r.servers.push(ServerFigures {
            cpu_pct: 60.0,
            ..Default::default()
        });
        let t = table(&r);
        assert!(t.contains("broker CPU"), "{t}");
        assert!(t.contains("nodes + broker 90%, 9.00% of a core"), "{t}");
    }
}
