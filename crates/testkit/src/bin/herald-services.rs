//! `herald-services`: the real PostgreSQL and Kafka servers the tests start, for benchmarks and
//! manual runs. `herald-services postgres kafka` starts the ones named on free loopback ports,
//! prints `POSTGRES_DSN=…` and `KAFKA_BOOTSTRAP=…` lines, and stops them (removing their data)
//! when its standard input closes.

use std::io::{Read, Write};

use herald_testkit::kafka::KafkaServer;
use herald_testkit::postgres::PostgresServer;

fn main() {
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    if wanted.is_empty() || wanted.iter().any(|w| w != "postgres" && w != "kafka") {
        eprintln!("usage: herald-services [postgres] [kafka]   (stops when stdin closes)");
        std::process::exit(2);
    }
    let postgres = wanted
        .iter()
        .any(|w| w == "postgres")
        .then(PostgresServer::start);
    let kafka = wanted.iter().any(|w| w == "kafka").then(KafkaServer::start);
    let mut out = std::io::stdout().lock();
    if let Some(pg) = &postgres {
        let _ = writeln!(out, "POSTGRES_DSN={}", pg.dsn());
    }
    if let Some(k) = &kafka {
        let _ = writeln!(out, "KAFKA_BOOTSTRAP={}", k.bootstrap());
    }
    let _ = writeln!(out, "READY");
    let _ = out.flush();
    drop(out);
    // Until the caller closes our stdin; then the servers drop and stop.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop((postgres, kafka));
}
