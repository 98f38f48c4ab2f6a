//! Control messages between nodes: API disconnects and server-side (un)subscribes reaching a
//! client wherever it is connected, and node liveness for `/api/info`.

use super::*;

impl Hub {
    /// Act on a control message for local connections.
    pub fn apply_control(&self, message: ControlMessage) {
        match message {
            ControlMessage::Disconnect { user, client, code } => {
                for out in self.find(user.as_deref(), client.as_deref()) {
                    out.close(CloseRequest {
                        code: CloseCode(code),
                        reason: "disconnected by the server API".into(),
                        after_ms: None,
                    });
                }
            }
            ControlMessage::Subscribe { user, channel } => {
                for out in self.find(Some(&user), None) {
                    out.control(Control::Subscribe(channel.clone()));
                }
            }
            ControlMessage::Unsubscribe { user, channel } => {
                for out in self.find(Some(&user), None) {
                    out.control(Control::Unsubscribe(channel.clone()));
                }
            }
            ControlMessage::NodeInfo(info) => {
                if info.name != self.shared.node_name {
                    let mut nodes = self.shared.nodes.lock().expect("nodes lock");
                    nodes.insert(info.name.clone(), (info, Instant::now()));
                }
            }
        }
    }

    pub(super) fn find(&self, user: Option<&str>, client: Option<&str>) -> Vec<Arc<Outbound>> {
        let reg = self.shared.registry.lock().expect("registry lock");
        if let Some(client) = client {
            return reg
                .clients
                .get(client)
                .map(|e| e.out.clone())
                .into_iter()
                .collect();
        }
        let Some(user) = user else { return Vec::new() };
        reg.users
            .get(user)
            .into_iter()
            .flatten()
            .filter_map(|c| reg.clients.get(c).map(|e| e.out.clone()))
            .collect()
    }

    /// This node's report.
    pub fn node_info(&self) -> NodeInfo {
        NodeInfo {
            name: self.shared.node_name.clone(),
            connections: self.connection_count() as u64,
            subscriptions: self.shared.metrics.subscriptions.get().max(0) as u64,
            channels: self.shared.metrics.channels.get().max(0) as u64,
            uptime_s: self.shared.started.elapsed().as_secs(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
        }
    }

    /// This node and every other node heard from recently.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        let mut nodes = self.shared.nodes.lock().expect("nodes lock");
        nodes.retain(|_, (_, at)| at.elapsed() < NODE_INFO_EXPIRES);
        let mut all = vec![self.node_info()];
        all.extend(nodes.values().map(|(info, _)| info.clone()));
        all
    }
}
