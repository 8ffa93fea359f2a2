//! The checker catches what it must: loss, duplicates, reorders, silent
//! data loss, presence ghosts.

use std::collections::{BTreeSet, HashSet};

use super::{History, Presence, PresenceReport, SubscriberReport};

fn log(tags: &[&str]) -> HashSet<String> {
    tags.iter().map(|t| t.to_string()).collect()
}

#[test]
fn counts_loss_duplicates_and_reorders_and_excuses_told_losses() {
    let h = History::new();
    for (i, t) in ["a", "b", "c", "d"].iter().enumerate() {
        h.acked(t, "e1", i as u64 + 1);
    }
    // ok: everything once, in order.
    for (i, t) in ["a", "b", "c", "d"].iter().enumerate() {
        h.received("ok", "e1", i as u64 + 1, t);
    }
    // dup and reorder, and one lost.
    h.received("bad", "e1", 1, "a");
    h.received("bad", "e1", 3, "c");
    h.received("bad", "e1", 2, "b");
    h.received("bad", "e1", 2, "b");
    // Redis lost d: told (resync) or not.
    for (i, t) in ["a", "b", "c"].iter().enumerate() {
        h.received("told", "e1", i as u64 + 1, t);
        h.received("silent", "e1", i as u64 + 1, t);
    }
    h.resynced("told");
    let full = h.report(&log(&["a", "b", "c", "d"]));
    assert_eq!(full.subscribers["ok"], SubscriberReport { received: 4, ..Default::default() });
    let bad = &full.subscribers["bad"];
    assert_eq!((bad.lost, bad.duplicated, bad.reordered), (1, 1, 1), "{full}");
    assert!(!full.clean());
    let lossy = h.report(&log(&["a", "b", "c"]));
    assert_eq!(lossy.lost_by_redis, 1);
    assert_eq!((lossy.subscribers["told"].lost, lossy.subscribers["told"].excused), (0, 1));
    assert_eq!(lossy.subscribers["silent"].lost, 1, "a loss nobody was told of is a loss");
    // A new epoch may repeat tags and seqs: not duplicates.
    h.received("ok", "e2", 1, "a");
    assert_eq!(h.report(&log(&["a", "b", "c", "d"])).subscribers["ok"].duplicated, 0);
}

#[test]
fn ghosts_are_listed_or_joined_after_departure() {
    let p = Presence::new();
    p.join_seen("c1");
    p.listing(vec!["c1".into(), "c2".into()]);
    p.departed("c1");
    p.listing(vec!["c2".into()]);
    assert_eq!(p.report(), PresenceReport { listings: 2, ..Default::default() });
    p.join_seen("c1");
    p.listing(vec!["c1".into(), "c2".into()]);
    let r = p.report();
    assert_eq!((r.ghost_joins, r.ghost_listings, r.ghost_members, r.listings), (1, 1, 1, 3));
    assert_eq!(r.ghosts, BTreeSet::from(["c1".to_string()]));
}
