//! The checker against hand-made logs: each broken promise is caught, and a good log passes.

use herald_sim::checker::{check, Ack, ClientLog, Event};

fn sub(channel: &str, since: Option<(&str, u64)>) -> Event {
    Event::Subscribing {
        channel: channel.into(),
        since: since.map(|(e, o)| (e.into(), o)),
    }
}

fn reply(epoch: &str, offset: u64, recovered: Option<bool>, pubs: &[(u64, &str)]) -> Event {
    Event::Subscribed {
        channel: "c".into(),
        epoch: epoch.into(),
        offset,
        recovered,
        publications: pubs.iter().map(|(o, d)| (*o, d.to_string())).collect(),
    }
}

fn publ(offset: u64, data: &str) -> Event {
    Event::Pub {
        channel: "c".into(),
        offset,
        data: data.into(),
    }
}

fn ack(epoch: &str, offset: u64, data: &str, at_ms: u64) -> Ack {
    Ack {
        channel: "c".into(),
        epoch: epoch.into(),
        offset,
        data: data.into(),
        at_ms,
    }
}

fn log(events: Vec<Event>) -> Vec<ClientLog> {
    vec![ClientLog {
        client: "x".into(),
        events: events
            .into_iter()
            .enumerate()
            .map(|(i, e)| (i as u64, e))
            .collect(),
    }]
}

fn acks(n: u64) -> Vec<Ack> {
    (1..=n).map(|o| ack("E", o, &format!("d{o}"), o)).collect()
}

fn problems(events: Vec<Event>, acks: &[Ack], settled: bool) -> Vec<String> {
    check(&log(events), acks, settled)
        .into_iter()
        .map(|v| v.what)
        .collect()
}

#[test]
fn a_good_log_passes() {
    let good = vec![
        Event::Connected { node: 0 },
        sub("c", None),
        reply("E", 0, None, &[]),
        publ(1, "d1"),
        publ(2, "d2"),
        Event::Disconnected { code: None },
        Event::Connected { node: 1 },
        sub("c", Some(("E", 2))),
        reply("E", 4, Some(true), &[(3, "d3"), (4, "d4")]),
        Event::Unsub {
            channel: "c".into(),
            code: 4003,
        },
        sub("c", Some(("E", 4))),
        reply("E", 4, Some(true), &[]),
        publ(5, "d5"),
    ];
    assert_eq!(problems(good, &acks(5), true), Vec::<String>::new());
}

#[test]
fn a_silent_gap_is_caught() {
    let p = problems(
        vec![
            sub("c", None),
            reply("E", 0, None, &[]),
            publ(1, "d1"),
            publ(3, "d3"),
        ],
        &acks(3),
        false,
    );
    assert!(
        p.iter().any(|w| w.contains("silent gap: 3 after 1")),
        "{p:?}"
    );
}

#[test]
fn a_duplicate_is_caught() {
    let p = problems(
        vec![
            sub("c", None),
            reply("E", 0, None, &[]),
            publ(1, "d1"),
            publ(1, "d1"),
        ],
        &acks(1),
        false,
    );
    assert!(p.iter().any(|w| w.contains("duplicate")), "{p:?}");
}

#[test]
fn a_first_delivery_past_the_reply_is_a_gap() {
    // The bug of the unchecked baseline: reply at 5, first live publication 7.
    let p = problems(
        vec![sub("c", None), reply("E", 5, None, &[]), publ(7, "d7")],
        &acks(7),
        false,
    );
    assert!(
        p.iter().any(|w| w.contains("silent gap: 7 after 5")),
        "{p:?}"
    );
}

#[test]
fn a_partial_recovery_is_caught() {
    let p = problems(
        vec![
            sub("c", None),
            reply("E", 2, None, &[]),
            Event::Disconnected { code: None },
            sub("c", Some(("E", 2))),
            reply("E", 5, Some(true), &[(4, "d4"), (5, "d5")]),
        ],
        &acks(5),
        false,
    );
    assert!(
        p.iter().any(|w| w.contains("silent gap: 4 after 2")),
        "{p:?}"
    );
}

#[test]
fn recovered_across_epochs_or_backwards_is_caught() {
    let across = problems(
        vec![
            sub("c", None),
            reply("E", 2, None, &[]),
            sub("c", Some(("E", 2))),
            reply("F", 3, Some(true), &[]),
        ],
        &[],
        false,
    );
    assert!(
        across.iter().any(|w| w.contains("across epochs")),
        "{across:?}"
    );
    let backwards = problems(
        vec![
            sub("c", None),
            reply("E", 9, None, &[]),
            sub("c", Some(("E", 9))),
            reply("E", 5, Some(true), &[]),
        ],
        &[],
        false,
    );
    assert!(
        backwards.iter().any(|w| w.contains("went back")),
        "{backwards:?}"
    );
}

#[test]
fn the_wrong_publication_at_an_offset_is_caught() {
    let p = problems(
        vec![sub("c", None), reply("E", 0, None, &[]), publ(1, "other")],
        &acks(1),
        false,
    );
    assert!(
        p.iter()
            .any(|w| w.contains("the acknowledged publication there is d1")),
        "{p:?}"
    );
}

#[test]
fn an_offset_reused_after_a_rollback_is_caught() {
    // The client got d6 at (E, 6); after a rollback the broker acknowledged e6 at (E, 6) too and
    // the client recovered past it with recovered: true.
    let mut a = acks(7);
    a.push(ack("E", 6, "e6", 20));
    let p = problems(
        vec![
            sub("c", None),
            reply("E", 5, None, &[]),
            publ(6, "d6"),
            Event::Disconnected { code: None },
            sub("c", Some(("E", 6))),
            reply("E", 7, Some(true), &[(7, "d7")]),
        ],
        &a,
        false,
    );
    assert!(p.iter().any(|w| w.contains("acknowledged twice")), "{p:?}");
    assert!(
        p.iter()
            .any(|w| w.contains("e6") && w.contains("never delivered")),
        "{p:?}"
    );
}

#[test]
fn a_lost_tail_is_caught_at_the_end() {
    let p = problems(
        vec![sub("c", None), reply("E", 0, None, &[]), publ(1, "d1")],
        &acks(2),
        true,
    );
    assert!(p.iter().any(|w| w.contains("lost, never told")), "{p:?}");
    // Told plainly (unsub 4003, then recovered: false at the new top): no violation.
    let told = problems(
        vec![
            sub("c", None),
            reply("E", 0, None, &[]),
            publ(1, "d1"),
            Event::Unsub {
                channel: "c".into(),
                code: 4003,
            },
            sub("c", Some(("E", 1))),
            reply("E", 2, Some(false), &[]),
        ],
        &acks(2),
        true,
    );
    assert_eq!(told, Vec::<String>::new());
}

#[test]
fn a_publication_without_a_subscription_is_caught() {
    let p = problems(vec![publ(1, "d1")], &acks(1), false);
    assert!(p.iter().any(|w| w.contains("while Idle")), "{p:?}");
}
