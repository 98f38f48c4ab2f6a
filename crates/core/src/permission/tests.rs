//! Every combination of static rule × token × hook verdict × command, through the same steps a
//! session takes: try to subscribe (asking the hook where [`decide`] says so), then try each
//! command with whatever subscription that left.

use super::*;

const RULES: [SubscribePolicy; 3] = [
    SubscribePolicy::Anonymous,
    SubscribePolicy::Authenticated,
    SubscribePolicy::Token,
];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Grant {
    None,
    ConnectionToken,
    SubscriptionToken,
}

#[derive(Debug, Clone, Copy)]
struct Case {
    rule: SubscribePolicy,
    subscribe_proxy: bool,
    publish: bool,
    publish_proxy: bool,
    user: &'static str,
    channel: &'static str,
    grant: Grant,
    subscribe_hook_allows: bool,
    publish_hook_allows: bool,
    /// Whether the client tries to subscribe before the other commands.
    subscribes_first: bool,
}

fn all_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for rule in RULES {
        for subscribe_proxy in [false, true] {
            for publish in [false, true] {
                for publish_proxy in [false, true] {
                    for user in ["", "alice", "eve"] {
                        for channel in ["room", "dm#alice,bob"] {
                            for grant in [
                                Grant::None,
                                Grant::ConnectionToken,
                                Grant::SubscriptionToken,
                            ] {
                                for subscribe_hook_allows in [false, true] {
                                    for publish_hook_allows in [false, true] {
                                        for subscribes_first in [false, true] {
                                            cases.push(Case {
                                                rule,
                                                subscribe_proxy,
                                                publish,
                                                publish_proxy,
                                                user,
                                                channel,
                                                grant,
                                                subscribe_hook_allows,
                                                publish_hook_allows,
                                                subscribes_first,
                                            });
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    cases
}

/// Runs a case through [`decide`] the way a session does; returns whether each command succeeds.
fn run(c: &Case) -> [bool; 4] {
    let ns = NamespaceConfig {
        subscribe: c.rule,
        subscribe_proxy: c.subscribe_proxy,
        publish: c.publish,
        publish_proxy: c.publish_proxy,
        ..NamespaceConfig::default()
    };
    let mut client = Client {
        user: c.user,
        subscribed: false,
        granted: c.grant == Grant::ConnectionToken,
        // A subscription token only comes with a subscribe request.
        has_subscription_token: false,
        grants: None,
    };
    let subscribed = if c.subscribes_first || client.granted {
        let asking = Client {
            has_subscription_token: c.grant == Grant::SubscriptionToken,
            ..client
        };
        match decide(&ns, c.channel, &asking, Action::Subscribe) {
            Ok(Allowed::Yes) => true,
            Ok(Allowed::IfSubscribeHookAllows) => c.subscribe_hook_allows,
            Ok(Allowed::IfPublishHookAllows) => panic!("a subscribe never asks the publish hook"),
            Err(_) => false,
        }
    } else {
        false
    };
    client.subscribed = subscribed;
    let mut outcome = [subscribed, false, false, false];
    for (i, action) in [Action::History, Action::Presence, Action::Publish]
        .into_iter()
        .enumerate()
    {
        outcome[i + 1] = match decide(&ns, c.channel, &client, action) {
            Ok(Allowed::Yes) => true,
            Ok(Allowed::IfPublishHookAllows) => {
                assert_eq!(action, Action::Publish);
                c.publish_hook_allows
            }
            Ok(Allowed::IfSubscribeHookAllows) => {
                panic!("only a subscribe asks the subscribe hook")
            }
            Err(_) => false,
        };
    }
    outcome
}

/// What the docs promise, stated plainly and separately from the implementation.
fn promised(c: &Case) -> [bool; 4] {
    let listed = !c.channel.contains('#') || c.user == "alice";
    let static_rule_admits = match c.rule {
        SubscribePolicy::Anonymous => true,
        SubscribePolicy::Authenticated => !c.user.is_empty(),
        SubscribePolicy::Token => false,
    };
    let granted = c.grant == Grant::ConnectionToken;
    let tried = c.subscribes_first || granted;
    let subscribed = listed
        && tried
        && (granted
            || c.grant == Grant::SubscriptionToken
            || if c.subscribe_proxy {
                c.subscribe_hook_allows
            } else {
                static_rule_admits
            });
    // Where the hook decides, only a subscription (or a grant) reads; elsewhere the static rule
    // is enough without subscribing.
    let reads = listed && (subscribed || granted || (!c.subscribe_proxy && static_rule_admits));
    let publishes = if c.publish_proxy {
        listed && c.publish_hook_allows
    } else {
        c.publish && reads
    };
    [subscribed, reads, reads, publishes]
}

#[test]
fn every_rule_token_hook_verdict_and_command() {
    let cases = all_cases();
    assert_eq!(cases.len(), 3 * 2 * 2 * 2 * 3 * 2 * 3 * 2 * 2 * 2);
    for c in &cases {
        assert_eq!(
            run(c),
            promised(c),
            "{c:?} (subscribe, history, presence, publish)"
        );
    }
}

#[test]
fn a_client_the_subscribe_hook_refused_can_neither_read_nor_publish() {
    for rule in [SubscribePolicy::Anonymous, SubscribePolicy::Authenticated] {
        let c = Case {
            rule,
            subscribe_proxy: true,
            publish: true,
            publish_proxy: false,
            user: "alice",
            channel: "room",
            grant: Grant::None,
            subscribe_hook_allows: false,
            publish_hook_allows: false,
            subscribes_first: true,
        };
        assert_eq!(run(&c), [false, false, false, false], "{rule:?}");
        let allowed = Case {
            subscribe_hook_allows: true,
            ..c
        };
        assert_eq!(run(&allowed), [true, true, true, true], "{rule:?}");
    }
}

#[test]
fn refusals_say_why() {
    let ns = NamespaceConfig {
        subscribe_proxy: true,
        ..NamespaceConfig::default()
    };
    assert_eq!(
        decide(&ns, "room", &Client::new("alice"), Action::History),
        Err(Denied::NeedsSubscription)
    );
    assert_eq!(
        decide(&ns, "dm#bob", &Client::new("alice"), Action::Subscribe),
        Err(Denied::OtherUsersOnly)
    );
    let plain = NamespaceConfig::default();
    assert_eq!(
        decide(&plain, "room", &Client::new(""), Action::Presence),
        Err(Denied::NeedsUser)
    );
    assert_eq!(
        decide(&plain, "room", &Client::new("alice"), Action::Publish),
        Err(Denied::PublishOff)
    );
    let token = NamespaceConfig {
        subscribe: SubscribePolicy::Token,
        ..NamespaceConfig::default()
    };
    assert_eq!(
        decide(&token, "room", &Client::new("alice"), Action::Subscribe),
        Err(Denied::NeedsSubscriptionToken)
    );
    let err: CommandError = Denied::NeedsSubscription.into();
    assert_eq!(err.code, ErrorCode::PermissionDenied);
}

#[test]
fn client_events_need_every_condition() {
    for bits in 0..16u8 {
        let event = ClientEvent {
            enabled: bits & 1 != 0,
            subscribed: bits & 2 != 0,
            signed_channel: bits & 4 != 0,
            encrypted: bits & 8 != 0,
        };
        let promised =
            event.enabled && event.subscribed && event.signed_channel && !event.encrypted;
        assert_eq!(decide_client_event(&event).is_ok(), promised, "{event:?}");
    }
}

#[test]
fn a_subscription_with_a_list_of_rights_may_do_exactly_what_it_lists() {
    let ns = NamespaceConfig {
        subscribe: SubscribePolicy::Anonymous,
        history: true,
        presence: true,
        publish: false,
        ..NamespaceConfig::default()
    };
    let only_publish = Grants {
        publish: true,
        ..Grants::default()
    };
    let client = Client {
        subscribed: true,
        grants: Some(only_publish),
        ..Client::new("alice")
    };
    assert_eq!(
        decide(&ns, "room", &client, Action::Publish),
        Ok(Allowed::Yes),
        "publish = false, but the backend allowed it"
    );
    for action in [Action::History, Action::Presence] {
        assert_eq!(
            decide(&ns, "room", &client, action),
            Err(Denied::NotGranted),
            "{action:?} is not in the list"
        );
    }
    // The publish hook still decides where the namespace has one.
    let proxied = NamespaceConfig {
        publish_proxy: true,
        ..ns.clone()
    };
    assert_eq!(
        decide(&proxied, "room", &client, Action::Publish),
        Ok(Allowed::IfPublishHookAllows)
    );
    // A list only counts on a live subscription, and never widens a user list.
    let not_subscribed = Client {
        subscribed: false,
        ..client
    };
    assert_eq!(
        decide(&ns, "room", &not_subscribed, Action::Publish),
        Err(Denied::PublishOff)
    );
    assert_eq!(
        decide(&ns, "room#bob", &client, Action::Publish),
        Err(Denied::OtherUsersOnly)
    );
}
