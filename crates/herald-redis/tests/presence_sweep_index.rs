//! The presence sweep index is only ever early: a join that lands while
//! another node's sweeper holds a claim on the channel replaces the claim
//! (so the sweeper's settle cannot push the channel past the new lease),
//! and a channel whose index entry was lost is indexed again by its next
//! join, after which its orphaned expired leases are swept.

use std::time::Duration;

use herald_core::conformance::{eventually, LONG_TTL};
use herald_core::{Engine, Joined, Lease, Lifecycle, Member, Presence};
use herald_proto::ChannelName;
use herald_redis::testing::{self, RedisServer};

const DUE: &str = "herald:presence:due";

fn member(user: &str, client: &str) -> Member {
    Member { client_id: client.into(), user: user.into(), device: None, info: None }
}

async fn swept(engine: &dyn Engine, ch: &ChannelName, user: &str) -> Lease {
    eventually("the expired lease is swept", || async {
        let got = engine.presence_expire(100).await.expect("expire");
        got.into_iter().find(|(c, l)| c == ch && l.member.user == user).map(|(_, l)| l)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_replaces_a_sweepers_claim_so_its_lease_is_swept_on_time() {
    testing::init_tracing();
    let redis = RedisServer::start();
    let engine = testing::engine(&redis.url()).await;
    let ch = ChannelName::new("room:claimed").unwrap();
    engine.presence_join(&ch, &member("stays", "c"), LONG_TTL).await.unwrap();
    // Another node's sweeper holds a claim on the channel that runs out
    // before the new lease does: a plain "lower only" write would keep it,
    // and the sweeper's settle would then move the channel to the long
    // lease's expiry, past the new one.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    redis.cli(&["ZADD", DUE, &format!("{}.5", now + 1_000), ch.as_str()]);
    let short = engine.presence_join(&ch, &member("brief", "c"), Duration::from_secs(2)).await.unwrap();
    let Joined::New(short) = short else { panic!("a new member") };
    let score: f64 = redis.cli(&["ZSCORE", DUE, ch.as_str()]).trim().parse().unwrap();
    assert_eq!(score.fract(), 0.0, "the claim is replaced: the sweeper's settle leaves the score alone");
    assert!(score as u64 <= short.expires_at_ms, "due no later than the new lease ({score})");
    assert_eq!(swept(&*engine, &ch, "brief").await, short);
    assert_eq!(engine.presence_count(&ch).await.unwrap(), 1, "the long lease stays");
    engine.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_channel_missing_from_the_index_is_swept_after_its_next_join() {
    testing::init_tracing();
    let redis = RedisServer::start();
    let engine = testing::engine(&redis.url()).await;
    let ch = ChannelName::new("room:orphan").unwrap();
    let Joined::New(orphan) =
        engine.presence_join(&ch, &member("orphan", "c"), Duration::from_millis(200)).await.unwrap()
    else {
        panic!("a new member")
    };
    redis.cli(&["DEL", DUE]); // lost with Redis's data, say
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(engine.presence_expire(100).await.unwrap().is_empty(), "nothing indexed, nothing found");
    assert_eq!(engine.presence_count(&ch).await.unwrap(), 0, "expired all the same");

    // Any join on the channel indexes it again; the sweep then finds every
    // expired lease of the channel, the orphan too.
    engine.presence_join(&ch, &member("next", "c"), Duration::from_millis(200)).await.unwrap();
    assert_eq!(swept(&*engine, &ch, "orphan").await, orphan);
    engine.close().await;
}
