//! Herald's Broker on Redis: not implemented yet.

use herald_broker::{BrokerError, SharedBroker};

/// Connect to the broker at `url` as node `node`.
pub async fn connect(url: &str, node: &str) -> Result<SharedBroker, BrokerError> {
    let _ = node;
    Err(BrokerError::Unavailable(format!("the redis broker is not implemented yet ({url})")))
}
