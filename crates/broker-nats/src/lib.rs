//! Herald's Broker on Nats: not implemented yet.

use herald_broker::{BrokerError, SharedBroker};

/// Connect to the broker at `url` as node `node`.
pub async fn connect(url: &str, node: &str) -> Result<SharedBroker, BrokerError> {
    let _ = node;
    Err(BrokerError::Unavailable(format!("the nats broker is not implemented yet ({url})")))
}
