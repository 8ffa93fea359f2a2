//! Scenarios of [`Control`](crate::engine::Control): bans and revocations
//! keep the later time and are read back by `admission`; the control
//! channel hands a broadcast to this node's sink; node entries are listed
//! while their lease holds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use super::{now_ms, Fixture, EXPIRY_DEADLINE};
use crate::engine::{Ban, ControlSink, NodeView};

/// Keeps every order it is given.
#[derive(Default)]
struct Orders(Mutex<Vec<Bytes>>);

impl ControlSink for Orders {
    fn order(&self, order: Bytes) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(order);
    }
}

/// A ban holds for its user (every device) or its device only, the later
/// of two bans wins, an ended ban is not reported; a revocation keeps the
/// later time.
pub async fn bans_and_revocations_keep_the_later_time(fx: &Fixture) {
    let e = &fx.engine;
    let user = format!("{}-u", fx.prefix);
    let now = now_ms();
    let none = e.admission(&user, Some("d1"), now).await.expect("admission");
    assert_eq!((none.banned_until_ms, none.revoked_before_ms), (None, None));

    let device_ban = Ban { user: user.clone(), device: Some("d1".into()), until_ms: now + 60_000 };
    e.ban(&device_ban).await.expect("ban");
    assert_eq!(e.admission(&user, Some("d1"), now).await.unwrap().banned_until_ms, Some(now + 60_000));
    assert_eq!(e.admission(&user, Some("d2"), now).await.unwrap().banned_until_ms, None, "another device");
    assert_eq!(e.admission(&user, None, now).await.unwrap().banned_until_ms, None, "no device");
    // A shorter ban changes nothing; a longer one extends it.
    e.ban(&Ban { until_ms: now + 1_000, ..device_ban.clone() }).await.expect("ban");
    assert_eq!(e.admission(&user, Some("d1"), now).await.unwrap().banned_until_ms, Some(now + 60_000));
    // The whole user, for every device; the later of the two is reported.
    e.ban(&Ban { user: user.clone(), device: None, until_ms: now + 120_000 }).await.expect("ban");
    assert_eq!(e.admission(&user, Some("d2"), now).await.unwrap().banned_until_ms, Some(now + 120_000));
    assert_eq!(e.admission(&user, Some("d1"), now).await.unwrap().banned_until_ms, Some(now + 120_000));
    // Ended at a later time.
    assert_eq!(e.admission(&user, Some("d1"), now + 200_000).await.unwrap().banned_until_ms, None);
    let other = format!("{}-v", fx.prefix);
    assert_eq!(e.admission(&other, None, now).await.unwrap().banned_until_ms, None, "another user");

    assert_eq!(e.revoke(&user, 5_000).await.expect("revoke"), 5_000);
    assert_eq!(e.revoke(&user, 4_000).await.expect("revoke"), 5_000, "an earlier time changes nothing");
    assert_eq!(e.revoke(&user, 6_000).await.expect("revoke"), 6_000);
    assert_eq!(e.admission(&user, None, now).await.unwrap().revoked_before_ms, Some(6_000));
    assert_eq!(e.admission(&other, None, now).await.unwrap().revoked_before_ms, None);
}

/// A broadcast reaches this node's sink; a node's entry is listed while
/// its lease holds and gone after it ends (or after it leaves).
pub async fn broadcasts_reach_the_sink_and_node_entries_are_leased(fx: &Fixture) {
    let e = &fx.engine;
    let orders = Arc::new(Orders::default());
    e.set_control_sink(orders.clone());
    let order = Bytes::from(format!("{}-order", fx.prefix));
    e.broadcast(order.clone()).await.expect("broadcast");
    let deadline = tokio::time::Instant::now() + EXPIRY_DEADLINE;
    while !orders.0.lock().unwrap().contains(&order) {
        assert!(tokio::time::Instant::now() < deadline, "the broadcast did not reach the sink");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let node = |id: &str| NodeView {
        id: format!("{}-{id}", fx.prefix),
        version: "test".into(),
        started_at_ms: now_ms(),
        connections: 3,
        subscriptions: 4,
        engine: "ok".into(),
        reported_at_ms: now_ms(),
    };
    let ids = |list: Vec<NodeView>| -> Vec<String> {
        list.into_iter().map(|n| n.id).filter(|id| id.starts_with(&fx.prefix)).collect()
    };
    let a = node("a");
    e.node_report(&a, Duration::from_secs(300)).await.expect("report");
    let listed = e.nodes().await.expect("nodes");
    assert_eq!(listed.iter().find(|n| n.id == a.id), Some(&a), "listed as reported");
    e.node_leave(&a.id).await.expect("leave");
    assert_eq!(ids(e.nodes().await.expect("nodes")), Vec::<String>::new(), "gone after it left");
    let b = node("b");
    e.node_report(&b, Duration::from_millis(300)).await.expect("report");
    assert_eq!(ids(e.nodes().await.expect("nodes")), std::slice::from_ref(&b.id));
    let deadline = tokio::time::Instant::now() + EXPIRY_DEADLINE;
    while !ids(e.nodes().await.expect("nodes")).is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the node's lease did not end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
