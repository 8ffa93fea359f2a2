//! Presence scenarios: leases, fencing tokens, expiry.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use herald_proto::{ChannelName, Member};

use super::{assert_eventually, now_ms, Fixture, CLOCK_SLACK_MS, EXPIRY_DEADLINE, LONG_TTL, SHORT_TTL};
use crate::presence::{member_key, FenceToken, Joined, Lease, Rejoined, Renewed};

fn keys(leases: &[Lease]) -> Vec<String> {
    leases.iter().map(Lease::key).collect()
}

fn ttl_ms(ttl: std::time::Duration) -> u64 {
    ttl.as_millis() as u64
}

async fn join_new(fx: &Fixture, ch: &ChannelName, member: &Member, ttl: std::time::Duration) -> Lease {
    match fx.engine.presence_join(ch, member, ttl).await.expect("join") {
        Joined::New(lease) => lease,
        other => panic!("{}: a first join is new, got {other:?}", member_key(member)),
    }
}

/// Call `presence_expire` until every lease of `ch` in `keys` was returned
/// (each once); returns them. Leases of other channels returned meanwhile
/// are ignored.
async fn expire_all(fx: &Fixture, ch: &ChannelName, keys: &[String]) -> Vec<Lease> {
    let deadline = tokio::time::Instant::now() + EXPIRY_DEADLINE;
    let mut got: Vec<Lease> = Vec::new();
    loop {
        for (c, lease) in fx.engine.presence_expire(100).await.expect("expire") {
            if &c == ch {
                got.push(lease);
            }
        }
        let seen: HashSet<String> = got.iter().map(Lease::key).collect();
        if keys.iter().all(|k| seen.contains(k)) {
            return got;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{ch}: expired leases not all swept within {EXPIRY_DEADLINE:?} (got {:?})",
            self::keys(&got)
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Joined members are listed (by key, with their info), counted and found
/// by user; members of other channels and other users are not.
pub async fn presence_join_lists_counts_and_finds_users(fx: &Fixture) {
    let (ch, other, empty) = (fx.channel("lobby"), fx.channel("lobby2"), fx.channel("lobby3"));
    let ann_phone =
        Member { info: Some(serde_json::json!({"name": "Ann", "n": [1, 2]})), ..fx.member("ann", "phone") };
    let ann_laptop = Member { device: Some("laptop-1".into()), ..fx.member("ann", "laptop") };
    let bob = fx.member("bob", "c1");
    let before = now_ms();
    let mut tokens = HashSet::new();
    for m in [&ann_phone, &ann_laptop, &bob] {
        let lease = join_new(fx, &ch, m, LONG_TTL).await;
        assert_eq!(&lease.member, m, "the lease holds the member as joined");
        assert_eq!(lease.key(), member_key(m));
        assert!(
            lease.expires_at_ms + CLOCK_SLACK_MS >= before + ttl_ms(LONG_TTL)
                && lease.expires_at_ms <= now_ms() + ttl_ms(LONG_TTL) + CLOCK_SLACK_MS,
            "expires_at_ms {} is now + ttl",
            lease.expires_at_ms
        );
        assert!(tokens.insert(lease.token), "tokens are distinct");
    }
    join_new(fx, &other, &fx.member("cat", "c1"), LONG_TTL).await;

    let listed = fx.engine.presence(&ch, 100).await.expect("presence");
    let mut expected: Vec<String> = [&ann_phone, &ann_laptop, &bob].map(member_key).to_vec();
    expected.sort();
    assert_eq!(keys(&listed), expected, "every member once, ordered by key");
    for lease in &listed {
        let joined = [&ann_phone, &ann_laptop, &bob].into_iter().find(|m| member_key(m) == lease.key());
        assert_eq!(Some(&lease.member), joined, "member info is kept");
    }
    assert_eq!(fx.engine.presence(&ch, 2).await.expect("presence").len(), 2, "limit bounds the list");
    assert!(fx.engine.presence(&ch, 0).await.expect("presence").is_empty());
    assert_eq!(fx.engine.presence_count(&ch).await.expect("count"), 3);
    assert_eq!(fx.engine.presence_count(&other).await.expect("count"), 1, "per channel");

    let has = |user: String, ch: ChannelName| {
        let engine = fx.engine.clone();
        async move { engine.presence_has_user(&ch, &user).await.expect("has_user") }
    };
    assert!(has(fx.user("ann"), ch.clone()).await);
    assert!(has(fx.user("bob"), ch.clone()).await);
    assert!(!has(fx.user("cat"), ch.clone()).await, "cat is on another channel");
    // Near misses: a prefix of a user, and user + client id run together.
    assert!(!has(fx.user("an"), ch.clone()).await);
    assert!(!has(fx.user("annphone"), ch.clone()).await);
    assert!(!has(fx.user("bo"), ch.clone()).await);

    assert!(fx.engine.presence(&empty, 10).await.expect("presence").is_empty());
    assert_eq!(fx.engine.presence_count(&empty).await.expect("count"), 0);
    assert!(!has(fx.user("ann"), empty.clone()).await);
}

/// Joining again with the same member key takes the lease over: a greater
/// token, a fresh expiry, the new member info, and no second member. 50
/// concurrent joins of one member get distinct tokens and leave one lease,
/// with the greatest.
pub async fn presence_rejoin_reclaims_with_a_greater_token(fx: &Fixture) {
    let ch = fx.channel("reclaim");
    let m = fx.member("dan", "tab");
    let first = join_new(fx, &ch, &m, LONG_TTL).await;
    let moved = Member { info: Some(serde_json::json!({"node": 2})), ..m.clone() };
    let again = match fx.engine.presence_join(&ch, &moved, LONG_TTL).await.expect("rejoin") {
        Joined::Reclaimed(lease) => lease,
        other => panic!("a rejoin reclaims, got {other:?}"),
    };
    assert!(again.token > first.token, "token {} after {}", again.token, first.token);
    assert!(again.expires_at_ms >= first.expires_at_ms, "a fresh expiry");
    assert_eq!(again.member, moved, "the member info is the new one");
    assert_eq!(fx.engine.presence_count(&ch).await.expect("count"), 1, "no second member");
    assert_eq!(fx.engine.presence(&ch, 10).await.expect("presence"), vec![again.clone()]);

    let phone = join_new(fx, &ch, &fx.member("dan", "phone"), LONG_TTL).await;
    assert!(phone.token > again.token, "tokens grow per channel");
    assert_eq!(fx.engine.presence_count(&ch).await.expect("count"), 2, "another client is another member");

    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (engine, ch, m) = (fx.engine.clone(), ch.clone(), m.clone());
            tokio::spawn(async move { engine.presence_join(&ch, &m, LONG_TTL).await })
        })
        .collect();
    let mut tokens = Vec::new();
    for t in futures_util::future::join_all(tasks).await {
        match t.expect("task").expect("join") {
            Joined::Reclaimed(lease) => tokens.push(lease.token),
            other => panic!("the member exists: every join reclaims, got {other:?}"),
        }
    }
    let distinct: HashSet<FenceToken> = tokens.iter().copied().collect();
    assert_eq!(distinct.len(), tokens.len(), "concurrent joins get distinct tokens");
    assert!(tokens.iter().all(|t| *t > phone.token));
    let stored = fx.engine.presence(&ch, 10).await.expect("presence");
    assert_eq!(stored.len(), 2);
    let dan_tab = stored.iter().find(|l| l.key() == member_key(&m)).expect("listed");
    assert_eq!(Some(&dan_tab.token), tokens.iter().max(), "the last join holds the member");
}

/// Renew and leave with a token other than the stored one change nothing;
/// with the stored token they extend and remove; renew never creates.
pub async fn presence_stale_tokens_have_no_effect(fx: &Fixture) {
    let ch = fx.channel("fencing");
    let m = fx.member("eve", "c1");
    let key = member_key(&m);
    let old = join_new(fx, &ch, &m, LONG_TTL).await;
    let Joined::Reclaimed(current) = fx.engine.presence_join(&ch, &m, LONG_TTL).await.expect("rejoin") else {
        panic!("a rejoin reclaims");
    };

    let renew = |token, key: String| {
        let (engine, ch) = (fx.engine.clone(), ch.clone());
        async move { engine.presence_renew(&ch, &key, token, LONG_TTL).await.expect("renew") }
    };
    let leave = |token, key: String| {
        let (engine, ch) = (fx.engine.clone(), ch.clone());
        async move { engine.presence_leave(&ch, &key, token).await.expect("leave") }
    };
    assert_eq!(renew(old.token, key.clone()).await, Renewed::Superseded, "a stale holder is told");
    assert_eq!(leave(old.token, key.clone()).await, None, "a stale leave removes nothing");
    assert_eq!(
        fx.engine.presence(&ch, 10).await.expect("presence"),
        vec![current.clone()],
        "the lease is untouched: same token, same expiry"
    );

    let Renewed::Until(until) = renew(current.token, key.clone()).await else {
        panic!("the holder renews");
    };
    assert!(until >= current.expires_at_ms, "renewed to now + ttl");
    let listed = fx.engine.presence(&ch, 10).await.expect("presence");
    assert_eq!((listed[0].token, listed[0].expires_at_ms), (current.token, until));

    let stranger = member_key(&fx.member("eve", "c2"));
    assert_eq!(renew(current.token, stranger.clone()).await, Renewed::Gone, "renew never creates");
    assert_eq!(leave(current.token, stranger).await, None);
    assert_eq!(fx.engine.presence_count(&ch).await.expect("count"), 1);

    let left = leave(current.token, key.clone()).await.expect("the holder leaves");
    assert_eq!((left.key(), left.token, left.expires_at_ms), (key.clone(), current.token, until));
    assert_eq!(fx.engine.presence_count(&ch).await.expect("count"), 0);
    assert_eq!(renew(current.token, key.clone()).await, Renewed::Gone, "no resurrection after a leave");
    assert_eq!(leave(current.token, key).await, None, "exactly one leave");
    assert!(fx.engine.presence(&ch, 10).await.expect("presence").is_empty());
}

/// A lease that expired and was swept is gone for its holder: renew says
/// `Gone` and creates nothing; only a join brings the member back, as a
/// new member with a greater token.
pub async fn presence_renew_never_resurrects_a_swept_lease(fx: &Fixture) {
    let ch = fx.channel("swept");
    let m = fx.member("fay", "c1");
    let key = member_key(&m);
    let lease = join_new(fx, &ch, &m, SHORT_TTL).await;
    let swept = expire_all(fx, &ch, std::slice::from_ref(&key)).await;
    assert_eq!(swept, vec![lease.clone()], "the sweep returns the lease as it was");

    assert_eq!(
        fx.engine.presence_renew(&ch, &key, lease.token, LONG_TTL).await.expect("renew"),
        Renewed::Gone
    );
    assert!(fx.engine.presence(&ch, 10).await.expect("presence").is_empty(), "nothing was created");
    assert_eq!(fx.engine.presence_count(&ch).await.expect("count"), 0);
    assert!(!fx.engine.presence_has_user(&ch, &m.user).await.expect("has_user"));
    assert_eq!(fx.engine.presence_leave(&ch, &key, lease.token).await.expect("leave"), None);

    let back = join_new(fx, &ch, &m, LONG_TTL).await;
    assert!(back.token > lease.token, "a new member, with a greater token");
}

/// Expired leases vanish from lists, counts and user checks at once, before
/// any sweep; concurrent `presence_expire` callers then get each of them
/// exactly once, and never an unexpired one.
pub async fn presence_expire_returns_each_expired_lease_once(fx: &Fixture) {
    const SHORT: usize = 12;
    const LONG: usize = 3;
    const CALLERS: usize = 8;
    let ch = fx.channel("expiry");
    let mut short = Vec::new();
    for i in 0..SHORT {
        short.push(join_new(fx, &ch, &fx.member("brief", &format!("c{i}")), SHORT_TTL).await);
    }
    let mut long = Vec::new();
    for i in 0..LONG {
        long.push(join_new(fx, &ch, &fx.member("stays", &format!("c{i}")), LONG_TTL).await);
    }
    assert_eq!(fx.engine.presence_count(&ch).await.expect("count"), (SHORT + LONG) as u64);

    assert_eventually("the short leases expire", || async {
        fx.engine.presence_count(&ch).await.expect("count") == LONG as u64
    })
    .await;
    // Expired, not swept: invisible all the same.
    assert_eq!(keys(&fx.engine.presence(&ch, 100).await.expect("presence")), keys(&long));
    assert!(!fx.engine.presence_has_user(&ch, &fx.user("brief")).await.expect("has_user"));
    assert!(fx.engine.presence_has_user(&ch, &fx.user("stays")).await.expect("has_user"));

    let collected: Arc<Mutex<Vec<(ChannelName, Lease)>>> = Arc::default();
    let deadline = tokio::time::Instant::now() + EXPIRY_DEADLINE;
    let tasks: Vec<_> = (0..CALLERS)
        .map(|_| {
            let (engine, collected) = (fx.engine.clone(), collected.clone());
            tokio::spawn(async move {
                while tokio::time::Instant::now() < deadline {
                    let got = engine.presence_expire(3).await.expect("expire");
                    if got.is_empty() {
                        break;
                    }
                    collected.lock().unwrap_or_else(|e| e.into_inner()).extend(got);
                }
            })
        })
        .collect();
    for t in futures_util::future::join_all(tasks).await {
        t.expect("task");
    }
    let mine: Vec<Lease> = collected
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(c, _)| c == &ch)
        .map(|(_, l)| l.clone())
        .collect();
    let mut got = mine.clone();
    got.sort_by_key(Lease::key);
    let mut expected = short.clone();
    expected.sort_by_key(Lease::key);
    assert_eq!(got, expected, "each expired lease exactly once, as it was joined; no unexpired one");

    let again = fx.engine.presence_expire(1000).await.expect("expire");
    assert!(again.iter().all(|(c, _)| c != &ch), "nothing of this channel is returned twice");
    assert_eq!(fx.engine.presence(&ch, 100).await.expect("presence"), long, "unexpired leases stay");
}

/// Tokens keep growing when every lease of the channel is gone: a channel's
/// token counter is never reset.
pub async fn presence_tokens_stay_monotonic_without_leases(fx: &Fixture) {
    let ch = fx.channel("tokens");
    let mut last = 0;
    for round in 0..3 {
        for client in ["a", "b"] {
            let m = fx.member("gus", client);
            let lease = join_new(fx, &ch, &m, LONG_TTL).await;
            assert!(lease.token > last, "round {round}: token {} after {last}", lease.token);
            last = lease.token;
            let left = fx.engine.presence_leave(&ch, &lease.key(), lease.token).await.expect("leave");
            assert!(left.is_some());
        }
        assert_eq!(fx.engine.presence_count(&ch).await.expect("count"), 0, "no lease left");
    }
}

/// A rejoin carries the holder's token and loses to anything newer: it
/// brings back a swept lease with the same token (so the holder's leave
/// still removes it), extends one still held, and is fenced by a later
/// token (held, or held and removed since) and by a leave with its own
/// token, whether that leave removed a lease or came after the sweep.
pub async fn presence_rejoin_is_fenced_by_later_tokens_and_leaves(fx: &Fixture) {
    let ch = fx.channel("rejoin");
    let rejoin = |m: Member, token: FenceToken| {
        let (engine, ch) = (fx.engine.clone(), ch.clone());
        async move { engine.presence_rejoin(&ch, &m, token, LONG_TTL).await.expect("rejoin") }
    };

    // Swept while its holder was away: back with the same token, once.
    let m = fx.member("hal", "c1");
    let key = member_key(&m);
    let lease = join_new(fx, &ch, &m, SHORT_TTL).await;
    expire_all(fx, &ch, std::slice::from_ref(&key)).await;
    let back = match rejoin(m.clone(), lease.token).await {
        Rejoined::Back(back) => back,
        other => panic!("a swept lease comes back for its holder, got {other:?}"),
    };
    assert_eq!((back.key(), back.token, &back.member), (key.clone(), lease.token, &m), "same token");
    assert!(back.expires_at_ms > lease.expires_at_ms, "a fresh expiry");
    assert_eq!(fx.engine.presence(&ch, 10).await.expect("presence"), vec![back.clone()]);
    match rejoin(m.clone(), lease.token).await {
        Rejoined::Held(until) => assert!(until >= back.expires_at_ms, "extended"),
        other => panic!("a lease still held is extended, got {other:?}"),
    }
    assert!(matches!(
        fx.engine.presence_renew(&ch, &key, lease.token, LONG_TTL).await.expect("renew"),
        Renewed::Until(_)
    ));
    let left = fx.engine.presence_leave(&ch, &key, lease.token).await.expect("leave");
    assert_eq!(left.map(|l| l.token), Some(lease.token), "the holder's leave removes the lease it got back");
    assert_eq!(rejoin(m.clone(), lease.token).await, Rejoined::Fenced, "no rejoin after a leave");
    assert_eq!(fx.engine.presence_count(&ch).await.expect("count"), 0);

    // A clean close after the sweep (its leave removes nothing) still
    // fences a rejoin that comes after it.
    let m2 = fx.member("hal", "c2");
    let key2 = member_key(&m2);
    let lease2 = join_new(fx, &ch, &m2, SHORT_TTL).await;
    expire_all(fx, &ch, std::slice::from_ref(&key2)).await;
    assert_eq!(fx.engine.presence_leave(&ch, &key2, lease2.token).await.expect("leave"), None);
    assert_eq!(rejoin(m2.clone(), lease2.token).await, Rejoined::Fenced, "the holder left");
    assert_eq!(fx.engine.presence_count(&ch).await.expect("count"), 0, "nothing created");

    // Taken over by a later join: never taken back, not while the later
    // lease lives and not after it left.
    let m3 = fx.member("ida", "c1");
    let key3 = member_key(&m3);
    let old = join_new(fx, &ch, &m3, LONG_TTL).await;
    let Joined::Reclaimed(newer) = fx.engine.presence_join(&ch, &m3, LONG_TTL).await.expect("join") else {
        panic!("a second join reclaims");
    };
    assert_eq!(rejoin(m3.clone(), old.token).await, Rejoined::Fenced, "a later token holds the member");
    assert_eq!(fx.engine.presence(&ch, 10).await.expect("presence"), vec![newer.clone()], "untouched");
    assert!(fx.engine.presence_leave(&ch, &key3, newer.token).await.expect("leave").is_some());
    assert_eq!(rejoin(m3.clone(), old.token).await, Rejoined::Fenced, "a later token held it since");
    assert_eq!(fx.engine.presence_count(&ch).await.expect("count"), 0);

    // An earlier holder's removal does not fence a later one.
    let fresh = join_new(fx, &ch, &m3, SHORT_TTL).await;
    assert!(fresh.token > newer.token);
    expire_all(fx, &ch, std::slice::from_ref(&key3)).await;
    assert!(matches!(rejoin(m3.clone(), fresh.token).await, Rejoined::Back(l) if l.token == fresh.token));
    assert_eq!(keys(&fx.engine.presence(&ch, 10).await.expect("presence")), vec![key3]);
}
