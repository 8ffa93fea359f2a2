//! `POST /api/v1/messages` on the Redis engine: messages answered in
//! request order with their channel's seqs, subscribers on another node
//! receive them in that order, and a retried request appends each keyed
//! message once.

use herald_test_support::{engine_config, next_messages, seqs, Node, RedisServer};
use serde_json::{json, Value};

#[tokio::test]
async fn a_batch_on_redis_is_ordered_and_exactly_once_per_key() {
    let redis = RedisServer::start();
    let a = Node::on_redis(&redis.url()).await;
    let b = Node::on_redis_with(engine_config(&redis.url()), |_| {}).await;
    let mut sub = b.connect("reader").await;
    sub.subscribe("chat:rb1", None).await.unwrap();
    let messages: Vec<Value> = (0..20)
        .map(|i| {
            let ch = if i % 2 == 0 { "chat:rb1" } else { "chat:rb2" };
            json!({ "channel": ch, "data": i, "idempotency_key": format!("k{i}") })
        })
        .collect();
    let body = json!({ "messages": messages });
    let first = a.call("POST", "/api/v1/messages", Some(body.clone()), &[]).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let results = first.body["results"].as_array().unwrap().clone();
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["seq"], json!(i / 2 + 1), "{r}");
    }
    let got = next_messages(&mut sub, 10).await;
    assert_eq!(seqs(&got), (1..=10).collect::<Vec<_>>());

    let again = b.call("POST", "/api/v1/messages", Some(body), &[]).await;
    assert_eq!(again.headers.get("idempotent-replayed").unwrap(), "true", "{}", again.body);
    for (x, y) in results.iter().zip(again.body["results"].as_array().unwrap()) {
        assert_eq!((&x["seq"], &x["id"], &y["replayed"]), (&y["seq"], &y["id"], &json!(true)));
    }
    assert_eq!(a.history("chat:rb1").await.len(), 10);
    assert_eq!(a.history("chat:rb2").await.len(), 10);
}
