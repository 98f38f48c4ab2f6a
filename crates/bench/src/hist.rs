//! HDR histograms: the shape every latency is recorded in, how it travels between processes, and how
//! shards are merged (added, never averaged — docs/benchmarking.md rule 4).

use anyhow::{Context, Result};
use base64::Engine as _;
use hdrhistogram::serialization::{Deserializer, Serializer as _, V2Serializer};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Highest value a histogram records, in microseconds (10 minutes); larger values saturate.
const HIGHEST_US: u64 = 600_000_000;

/// A latency histogram in microseconds, 1 µs to 10 min, 3 significant digits.
///
/// Every shard uses exactly these bounds so that adding histograms is exact: the merged histogram
/// equals the histogram of the pooled samples, bucket for bucket.
pub fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, HIGHEST_US, 3).expect("static bounds are valid")
}

/// Encodes a histogram as base64 of its V2 serialization (what a worker sends on its stdout).
pub fn encode(h: &Histogram<u64>) -> String {
    let mut buf = Vec::new();
    V2Serializer::new()
        .serialize(h, &mut buf)
        .expect("serializing into a Vec cannot fail");
    base64::engine::general_purpose::STANDARD.encode(buf)
}

/// Decodes what [`encode`] produced.
///
/// # Errors
/// Bad base64 or a bad V2 payload.
pub fn decode(s: &str) -> Result<Histogram<u64>> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(s)
        .context("histogram base64")?;
    let h: Histogram<u64> = Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .map_err(|e| anyhow::anyhow!("histogram payload: {e:?}"))?;
    // Re-home into the common bounds so later additions never fail on a narrower shard.
    let mut out = new_hist();
    out.add(&h)
        .map_err(|e| anyhow::anyhow!("histogram bounds: {e:?}"))?;
    Ok(out)
}

/// Adds every encoded shard into one histogram (the only correct way to combine percentiles).
///
/// # Errors
/// A shard that does not decode.
pub fn merge_encoded<'a>(shards: impl IntoIterator<Item = &'a str>) -> Result<Histogram<u64>> {
    let mut total = new_hist();
    for s in shards {
        let h = decode(s)?;
        total
            .add(&h)
            .map_err(|e| anyhow::anyhow!("histogram add: {e:?}"))?;
    }
    Ok(total)
}

/// The percentiles a report shows, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Number of samples.
    pub count: u64,
    /// Minimum.
    pub min: u64,
    /// Mean (not a percentile; shown for reference only).
    pub mean: f64,
    /// 50th percentile.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Maximum.
    pub max: u64,
}

impl Summary {
    /// Percentiles of a histogram (all zero when empty).
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            count: h.len(),
            min: h.min(),
            mean: h.mean(),
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// Points of the percentile spectrum for charts: (percentile, value µs), from 0 to 99.999 and max.
pub fn spectrum(h: &Histogram<u64>) -> Vec<(f64, u64)> {
    if h.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for p in [
        0.0, 10.0, 25.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 99.999,
    ] {
        out.push((p, h.value_at_quantile(p / 100.0)));
    }
    out.push((100.0, h.max()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Merged shard histograms give exactly the percentiles of one histogram of the pooled samples,
    /// and those agree with the exact sorted-sample percentiles to within the 3-digit precision.
    #[test]
    fn merged_percentiles_equal_pooled_samples() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let shards = 5;
        let mut pooled = new_hist();
        let mut samples = Vec::new();
        let mut encoded = Vec::new();
        for shard in 0..shards {
            let mut h = new_hist();
            // Shards see different distributions on purpose: averaging their p99s would be wrong.
            let n = 2_000 + shard * 7_000;
            for _ in 0..n {
                let base = if shard == 3 { 50_000 } else { 200 };
                let v: u64 = base + rng.random_range(0..(base * (shard as u64 + 1)));
                h.record(v).unwrap();
                pooled.record(v).unwrap();
                samples.push(v);
            }
            encoded.push(encode(&h));
        }
        let merged = merge_encoded(encoded.iter().map(String::as_str)).unwrap();
        assert_eq!(merged.len(), samples.len() as u64);
        for q in [0.5, 0.9, 0.99, 0.999, 1.0] {
            assert_eq!(
                merged.value_at_quantile(q),
                pooled.value_at_quantile(q),
                "q={q}"
            );
        }
        assert_eq!(Summary::of(&merged), Summary::of(&pooled));
        samples.sort_unstable();
        for q in [0.5, 0.9, 0.99, 0.999] {
            let idx = ((q * samples.len() as f64).ceil() as usize).saturating_sub(1);
            let exact = samples[idx] as f64;
            let got = merged.value_at_quantile(q) as f64;
            assert!(
                (got - exact).abs() / exact <= 0.001,
                "q={q} exact={exact} got={got}"
            );
        }
    }

    #[test]
    fn encode_round_trips_and_empty_summary_is_zero() {
        let mut h = new_hist();
        h.record(1).unwrap();
        h.record(HIGHEST_US).unwrap();
        let d = decode(&encode(&h)).unwrap();
        assert_eq!(Summary::of(&d), Summary::of(&h));
        assert_eq!(Summary::of(&new_hist()), Summary::default());
    }
}
