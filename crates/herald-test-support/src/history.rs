//! A history checker for fault tests: what publishers were told and what
//! each subscriber received, checked against what the log finally holds.
//!
//! Publishers record every acknowledged (2xx) publish with a unique tag;
//! subscribers record every `message` frame as it arrived (before any
//! dedup), and every time they were told to resync (close `4005`, or
//! `epoch_changed` on a resubscribe). [`History::report`] then counts, per
//! subscriber:
//!
//! - **lost**: acknowledged messages still in the final log that the
//!   subscriber never got, plus acknowledged messages the log lost (Redis
//!   lost data) while the subscriber was never told to resync (a silent
//!   loss);
//! - **duplicated**: a seq received twice within one epoch, or one tag
//!   twice within one epoch;
//! - **reordered**: a seq lower than an earlier one of the same epoch
//!   (that is not a duplicate);
//! - **excused**: acknowledged messages the log lost (Redis lost data),
//!   not received, with the subscriber told to resync: the promise holds
//!   (a client never skips lost data silently).
//!
//! Presence has its own small checker, [`Presence`]: ghost members in a
//! listing (listed, but their connection is gone) and ghost `join`s (a
//! `join` pushed for a member after it departed for good).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::Mutex;
use std::time::Instant;

/// One message as a subscriber got it.
#[derive(Debug, Clone)]
pub struct Got {
    pub epoch: String,
    pub seq: u64,
    pub tag: String,
    pub at: Instant,
}

#[derive(Default)]
struct Inner {
    /// tag → (epoch, seq) the publisher was told.
    acked: BTreeMap<String, (String, u64)>,
    /// subscriber → what it got, in order.
    got: BTreeMap<String, Vec<Got>>,
    /// subscriber → when it was told to resync.
    resyncs: HashMap<String, Vec<Instant>>,
}

/// Shared by the publishers and subscribers of one test.
#[derive(Default)]
pub struct History {
    inner: Mutex<Inner>,
}

/// What one subscriber saw, counted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SubscriberReport {
    pub received: usize,
    pub lost: usize,
    pub duplicated: usize,
    pub reordered: usize,
    pub excused: usize,
    pub resyncs: usize,
    /// A few lost tags, for the failure message.
    pub lost_sample: Vec<String>,
}

/// The checker's verdict.
#[derive(Debug, Default)]
pub struct Report {
    pub acked: usize,
    /// Acknowledged messages no longer in the final log (Redis lost them).
    pub lost_by_redis: usize,
    pub subscribers: BTreeMap<String, SubscriberReport>,
}

impl Report {
    /// No subscriber lost, duplicated or reordered anything.
    pub fn clean(&self) -> bool {
        self.subscribers.values().all(|s| s.lost == 0 && s.duplicated == 0 && s.reordered == 0)
    }

    pub fn assert_clean(&self) {
        assert!(self.clean(), "history check failed:\n{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "acknowledged {}, lost by redis {}", self.acked, self.lost_by_redis)?;
        for (name, s) in &self.subscribers {
            writeln!(
                f,
                "  {name}: received {}, lost {}, duplicated {}, reordered {}, excused {}, resyncs {}{}",
                s.received,
                s.lost,
                s.duplicated,
                s.reordered,
                s.excused,
                s.resyncs,
                if s.lost_sample.is_empty() {
                    String::new()
                } else {
                    format!(" (lost e.g. {:?})", s.lost_sample)
                }
            )?;
        }
        Ok(())
    }
}

impl History {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A publish of `tag` was acknowledged with `(epoch, seq)`. A retry
    /// with the same key is told the same and records nothing new.
    pub fn acked(&self, tag: &str, epoch: &str, seq: u64) {
        self.lock().acked.insert(tag.to_owned(), (epoch.to_owned(), seq));
    }

    /// Subscriber `sub` registers (so one that got nothing is reported).
    pub fn subscriber(&self, sub: &str) {
        self.lock().got.entry(sub.to_owned()).or_default();
    }

    /// Subscriber `sub` got a message.
    pub fn received(&self, sub: &str, epoch: &str, seq: u64, tag: &str) {
        let got = Got { epoch: epoch.to_owned(), seq, tag: tag.to_owned(), at: Instant::now() };
        self.lock().got.entry(sub.to_owned()).or_default().push(got);
    }

    /// Subscriber `sub` was told to resync.
    pub fn resynced(&self, sub: &str) {
        self.lock().resyncs.entry(sub.to_owned()).or_default().push(Instant::now());
    }

    /// When `sub` was first told to resync, if it was.
    pub fn first_resync(&self, sub: &str) -> Option<Instant> {
        self.lock().resyncs.get(sub).and_then(|v| v.first().copied())
    }

    /// Tags acknowledged so far.
    pub fn acked_tags(&self) -> HashSet<String> {
        self.lock().acked.keys().cloned().collect()
    }

    /// Whether `sub` got every tag in `tags`.
    pub fn has_all(&self, sub: &str, tags: &HashSet<String>) -> bool {
        let inner = self.lock();
        let got: HashSet<&str> =
            inner.got.get(sub).map(|g| g.iter().map(|m| m.tag.as_str()).collect()).unwrap_or_default();
        tags.iter().all(|t| got.contains(t.as_str()))
    }

    /// Check every subscriber against `final_log`: the tags the channel's
    /// log holds at the end (every epoch that survived).
    pub fn report(&self, final_log: &HashSet<String>) -> Report {
        let inner = self.lock();
        let lost_by_redis: BTreeSet<&String> =
            inner.acked.keys().filter(|t| !final_log.contains(*t)).collect();
        let mut report =
            Report { acked: inner.acked.len(), lost_by_redis: lost_by_redis.len(), ..Default::default() };
        for (name, got) in &inner.got {
            let resyncs = inner.resyncs.get(name).map_or(0, Vec::len);
            let mut s = SubscriberReport { received: got.len(), resyncs, ..Default::default() };
            let mut last_seq: HashMap<&str, u64> = HashMap::new();
            let mut seen_seq: HashSet<(&str, u64)> = HashSet::new();
            let mut seen_tag: HashSet<(&str, &str)> = HashSet::new();
            for m in got {
                let dup_seq = !seen_seq.insert((m.epoch.as_str(), m.seq));
                let dup_tag = !seen_tag.insert((m.epoch.as_str(), m.tag.as_str()));
                if dup_seq || dup_tag {
                    s.duplicated += 1;
                    continue;
                }
                let last = last_seq.entry(m.epoch.as_str()).or_insert(0);
                if m.seq < *last {
                    s.reordered += 1;
                } else {
                    *last = m.seq;
                }
            }
            let received: HashSet<&str> = got.iter().map(|m| m.tag.as_str()).collect();
            for tag in inner.acked.keys() {
                if received.contains(tag.as_str()) {
                    continue;
                }
                if lost_by_redis.contains(tag) && resyncs > 0 {
                    s.excused += 1;
                } else {
                    s.lost += 1;
                    if s.lost_sample.len() < 5 {
                        s.lost_sample.push(tag.clone());
                    }
                }
            }
            report.subscribers.insert(name.clone(), s);
        }
        report
    }
}

/// Presence: ghosts in listings and ghost `join`s.
#[derive(Default)]
pub struct Presence {
    inner: Mutex<PresenceInner>,
}

#[derive(Default)]
struct PresenceInner {
    /// Members gone for good (their connection closed or was lost), by
    /// client id, with when.
    departed: HashMap<String, Instant>,
    /// `join` frames seen by observers: (client id, when).
    joins: Vec<(String, Instant)>,
    /// Listings taken: (when, client ids listed).
    listings: Vec<(Instant, Vec<String>)>,
}

/// The presence verdict.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PresenceReport {
    /// Listings that named a departed member, and how many such names.
    pub ghost_listings: usize,
    pub ghost_members: usize,
    /// `join` frames for a member after it departed.
    pub ghost_joins: usize,
    pub listings: usize,
    /// The departed members that were seen as ghosts.
    pub ghosts: BTreeSet<String>,
}

impl Presence {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PresenceInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `client_id`'s connection is gone for good from now on.
    pub fn departed(&self, client_id: &str) {
        self.lock().departed.insert(client_id.to_owned(), Instant::now());
    }

    /// An observer got a `join` for `client_id`.
    pub fn join_seen(&self, client_id: &str) {
        self.lock().joins.push((client_id.to_owned(), Instant::now()));
    }

    /// A presence listing, as client ids.
    pub fn listing(&self, client_ids: Vec<String>) {
        self.lock().listings.push((Instant::now(), client_ids));
    }

    /// `join`s seen for `client_id` so far.
    pub fn joins_of(&self, client_id: &str) -> usize {
        self.lock().joins.iter().filter(|(c, _)| c == client_id).count()
    }

    pub fn report(&self) -> PresenceReport {
        let inner = self.lock();
        let mut r = PresenceReport { listings: inner.listings.len(), ..Default::default() };
        let departed_before = |c: &str, at: Instant| inner.departed.get(c).is_some_and(|d| *d < at);
        for (at, ids) in &inner.listings {
            let ghosts: Vec<&String> = ids.iter().filter(|c| departed_before(c, *at)).collect();
            if !ghosts.is_empty() {
                r.ghost_listings += 1;
                r.ghost_members += ghosts.len();
                r.ghosts.extend(ghosts.into_iter().cloned());
            }
        }
        for (c, at) in &inner.joins {
            if departed_before(c, *at) {
                r.ghost_joins += 1;
                r.ghosts.insert(c.clone());
            }
        }
        r
    }
}

#[cfg(test)]
mod tests;
