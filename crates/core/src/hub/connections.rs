//! The client registry: connections by client id and user, for the HTTP API and control
//! messages.

use super::*;

impl Hub {
    /// Register a connection so the API can reach it by client id or user.
    pub fn register(&self, client: Arc<str>, user: Arc<str>, out: Arc<Outbound>) -> ConnKey {
        let key = ConnKey(self.shared.next_key.fetch_add(1, Ordering::Relaxed));
        let mut reg = self.shared.registry.lock().expect("registry lock");
        let slot = reg.add_to_user(&user, client.clone());
        if let Some(sink) = self.lifecycle() {
            sink.connected(key, &client, &user);
        }
        reg.clients.insert(client, ClientEntry { user, out, slot });
        key
    }

    /// Forget a connection (after it unsubscribed from everything).
    pub fn unregister(&self, client: &str) {
        let mut reg = self.shared.registry.lock().expect("registry lock");
        if let Some(entry) = reg.clients.remove(client) {
            reg.remove_from_user(&entry.user, entry.slot);
            if let Some(sink) = self.lifecycle() {
                sink.disconnected(client);
            }
        }
    }

    /// Change the user a registered connection is reachable by (a Pusher connection signs in
    /// after it connected).
    pub fn set_user(&self, client: &str, user: Arc<str>) {
        let mut reg = self.shared.registry.lock().expect("registry lock");
        let Some((key, entry)) = reg.clients.get_key_value(client) else {
            return;
        };
        let (client, old, old_slot) = (key.clone(), entry.user.clone(), entry.slot);
        reg.remove_from_user(&old, old_slot);
        let slot = reg.add_to_user(&user, client.clone());
        if let Some(sink) = self.lifecycle() {
            sink.user_changed(&client, &user);
        }
        if let Some(e) = reg.clients.get_mut(&client) {
            e.user = user;
            e.slot = slot;
        }
    }

    /// Number of registered connections.
    pub fn connection_count(&self) -> usize {
        self.shared
            .registry
            .lock()
            .expect("registry lock")
            .clients
            .len()
    }

    /// The client ids of `user`'s connections on this node (for the admin UI; not on a hot path).
    pub fn user_clients(&self, user: &str) -> Vec<String> {
        let reg = self.shared.registry.lock().expect("registry lock");
        reg.users
            .get(user)
            .map(|list| list.iter().map(|c| c.to_string()).collect())
            .unwrap_or_default()
    }
}
