//! `POST /api/v1/messages`: many messages in one request, each answered on
//! its own in request order; a bad message fails alone; a retried request
//! appends nothing twice and says `replayed`; a message's key is the single
//! publish's key; the cap per request; subscribers see the messages in
//! order. The Redis run is in `multi_node/batch_publish_on_redis.rs`.

use herald_test_support::*;
use serde_json::{json, Value};

async fn post_messages<E: herald_core::Engine + 'static>(srv: &TestServer<E>, messages: Value) -> Resp {
    srv.call("POST", "/api/v1/messages", Some(json!({ "messages": messages })), &[]).await
}

#[tokio::test]
async fn messages_are_appended_in_order_and_answered_in_order() {
    let srv = TestServer::start().await;
    let mut sub = srv.connect("reader").await;
    sub.subscribe("chat:b1", None).await.unwrap();
    let messages: Vec<Value> = (0..50).map(|i| json!({ "channel": "chat:b1", "data": { "n": i } })).collect();
    let r = post_messages(&srv, json!(messages)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let results = r.body["results"].as_array().unwrap();
    assert_eq!(results.len(), 50);
    for (i, res) in results.iter().enumerate() {
        assert_eq!(res["channel"], "chat:b1");
        assert_eq!(res["seq"], json!(i + 1), "{res}");
        assert!(res.get("replayed").is_none() && res.get("error").is_none(), "{res}");
    }
    let got = next_messages(&mut sub, 50).await;
    assert_eq!(seqs(&got), (1..=50).collect::<Vec<_>>());
    for (i, m) in got.iter().enumerate() {
        assert_eq!(data(m), json!({ "n": i }));
    }
    // Each message counts as one publish.
    let metrics = srv.get("/metrics").await.body;
    assert!(metrics.as_str().unwrap().contains("herald_published_total 50"), "{metrics}");
}

#[tokio::test]
async fn a_bad_message_fails_alone() {
    let srv = TestServer::start().await;
    let big = "x".repeat(srv.state.config().websocket.max_message_bytes + 1);
    let r = post_messages(
        &srv,
        json!([
            { "channel": "chat:b2", "data": 1 },
            { "channel": "nope:b2", "data": 2 },
            { "channel": "bad channel", "data": 3 },
            { "channel": "chat:b2", "data": big },
            { "channel": "room:never-made", "data": 4 },
            { "channel": "chat:b2", "data": 5, "meta": { "k": "v".repeat(1000) } },
            { "channel": "chat:b2", "data": 6, "deliver_at": 1, "delay_ms": 1 },
            { "channel": "chat:b2", "data": 7 },
        ]),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let codes: Vec<Value> =
        r.body["results"].as_array().unwrap().iter().map(|x| x["error"]["code"].clone()).collect();
    assert_eq!(
        codes,
        vec![
            Value::Null,
            json!("unknown_namespace"),
            json!("bad_channel"),
            json!("payload_too_large"),
            json!("not_found"),
            json!("bad_request"),
            json!("bad_request"),
            Value::Null,
        ]
    );
    let results = &r.body["results"];
    assert_eq!((results[0]["seq"].clone(), results[7]["seq"].clone()), (json!(1), json!(2)));
    assert_eq!(results[1]["channel"], "nope:b2", "a failure names the channel as given");
    let stored: Vec<Value> = srv.history("chat:b2").await.into_iter().map(|m| m["data"].clone()).collect();
    assert_eq!(stored, vec![json!(1), json!(7)]);
}

#[tokio::test]
async fn a_retried_request_appends_each_keyed_message_once() {
    let srv = TestServer::start().await;
    let batch = json!([
        { "channel": "chat:r1", "data": "a", "idempotency_key": "ka" },
        { "channel": "chat:r2", "data": "b", "idempotency_key": "kb" },
        { "channel": "chat:r1", "data": "c", "idempotency_key": "kc" },
    ]);
    let first = post_messages(&srv, batch.clone()).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert!(first.headers.get("idempotent-replayed").is_none());
    let again = post_messages(&srv, batch).await;
    assert_eq!(again.status, 200, "{}", again.body);
    assert_eq!(again.headers.get("idempotent-replayed").unwrap(), "true");
    for (a, b) in
        first.body["results"].as_array().unwrap().iter().zip(again.body["results"].as_array().unwrap())
    {
        assert_eq!((&a["seq"], &a["id"]), (&b["seq"], &b["id"]), "the same message");
        assert_eq!(b["replayed"], true);
    }
    assert_eq!(srv.history("chat:r1").await.len(), 2);
    assert_eq!(srv.history("chat:r2").await.len(), 1);

    // A partial failure: the retry completes it. `kd` reused with another
    // body is refused alone; the new `ke` is appended; `ka` replays.
    let mixed = post_messages(
        &srv,
        json!([
            { "channel": "chat:r1", "data": "a", "idempotency_key": "ka" },
            { "channel": "chat:r1", "data": "other", "idempotency_key": "kb" },
            { "channel": "chat:r1", "data": "e", "idempotency_key": "ke" },
            { "channel": "chat:r1", "data": "e2", "idempotency_key": "ke" },
        ]),
    )
    .await;
    assert_eq!(mixed.status, 200, "{}", mixed.body);
    assert!(mixed.headers.get("idempotent-replayed").is_none());
    let res = &mixed.body["results"];
    assert_eq!(res[0]["replayed"], true);
    assert_eq!(res[1]["error"]["code"], "idempotency_key_reused", "{res}");
    assert_eq!((res[2]["seq"].clone(), res[2].get("replayed")), (json!(3), None));
    assert_eq!(res[3]["error"]["code"], "bad_request", "a key names one message of a request");
    assert_eq!(srv.history("chat:r1").await.len(), 3);
}

#[tokio::test]
async fn a_message_key_is_the_single_publish_key() {
    let srv = TestServer::start().await;
    let single = srv.publish_with("chat:s1", json!({ "data": 1 }), Some("k1"), Some(API_KEY)).await;
    assert_eq!(single.status, 201, "{}", single.body);
    let r = post_messages(&srv, json!([{ "channel": "chat:s1", "data": 1, "idempotency_key": "k1" }])).await;
    assert_eq!(r.body["results"][0]["replayed"], true, "{}", r.body);
    assert_eq!(r.body["results"][0]["id"], single.body["id"]);
    // Scoped by credential: another API key's `k1` is another message.
    let other = srv.publish_with("chat:s1", json!({ "data": 1 }), Some("k1"), Some(API_KEY_2)).await;
    assert_eq!((other.status, other.body["seq"].clone()), (201, json!(2)));
    // An Idempotency-Key header on the batch is refused: keys are per message.
    let h = srv
        .call(
            "POST",
            "/api/v1/messages",
            Some(json!({ "messages": [{ "channel": "chat:s1", "data": 1 }] })),
            &[("Idempotency-Key", "k")],
        )
        .await;
    assert_eq!((h.status, h.code()), (400, "bad_request"));
}

#[tokio::test]
async fn mixed_channels_and_a_scheduled_message() {
    let srv = TestServer::start().await;
    let mut sub = srv.connect("reader").await;
    sub.subscribe("chat:m1", None).await.unwrap();
    sub.subscribe("live:m2", None).await.unwrap();
    let batch = json!([
        { "channel": "chat:m1", "data": "now", "meta": { "k": "v" } },
        { "channel": "live:m2", "data": "volatile" },
        { "channel": "chat:m1", "data": "later", "delay_ms": 300, "idempotency_key": "s" },
        { "channel": "chat:m1", "data": "now2" },
    ]);
    let r = post_messages(&srv, batch.clone()).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let res = &r.body["results"];
    assert_eq!(res[0]["seq"], 1);
    assert!(res[1]["seq"].is_null() && res[1]["id"].is_string(), "volatile: no seq: {res}");
    assert!(res[2]["scheduled_id"].is_string() && res[2]["deliver_at"].is_u64(), "{res}");
    assert_eq!(res[3]["seq"], 2);
    let msgs = next_messages(&mut sub, 4).await;
    let order: Vec<Value> = msgs.iter().map(data).collect();
    assert_eq!(order, vec![json!("now"), json!("volatile"), json!("now2"), json!("later")]);
    assert_eq!(msgs[0].meta.as_ref().unwrap()["k"], "v");
    // The schedule under its key replays too (once delivered, the receipt
    // stands).
    let again = post_messages(&srv, json!([batch[2].clone()])).await;
    assert_eq!(again.body["results"][0]["scheduled_id"], res[2]["scheduled_id"], "{}", again.body);
    assert_eq!(again.body["results"][0]["replayed"], true);
}

#[tokio::test]
async fn a_closed_room_refuses_its_messages_only() {
    let srv = TestServer::start().await;
    create_room(&srv, "room:c1", "host", 60).await;
    let closed = srv.call("PATCH", "/api/v1/rooms/room:c1", Some(json!({ "state": "closed" })), &[]).await;
    assert_eq!(closed.status, 200, "{}", closed.body);
    let r = post_messages(
        &srv,
        json!([{ "channel": "room:c1", "data": 1 }, { "channel": "chat:c1", "data": 2 }]),
    )
    .await;
    assert_eq!(r.body["results"][0]["error"]["code"], "channel_closed", "{}", r.body);
    assert_eq!(r.body["results"][1]["seq"], 1);
}

#[tokio::test]
async fn the_cap_refuses_the_whole_request() {
    let srv = TestServer::start_with(|c| c.publish.max_batch_messages = 3).await;
    let four: Vec<Value> = (0..4).map(|i| json!({ "channel": "chat:cap", "data": i })).collect();
    let r = post_messages(&srv, json!(four)).await;
    assert_eq!((r.status, r.code()), (413, "payload_too_large"), "{}", r.body);
    assert!(r.body["detail"].as_str().unwrap().contains("publish.max_batch_messages"));
    let empty = post_messages(&srv, json!([])).await;
    assert_eq!((empty.status, empty.code()), (400, "bad_request"));
    let unknown = post_messages(&srv, json!([{ "channel": "chat:cap", "data": 1, "extra": 1 }])).await;
    assert_eq!((unknown.status, unknown.code()), (400, "bad_request"), "malformed: refused whole");
    assert!(srv.history("chat:cap").await.is_empty());
}

#[tokio::test]
async fn the_rust_http_api_publishes_messages() {
    use herald_client::{HttpApi, MessageItem, MessageResult};
    let srv = TestServer::start().await;
    let api = HttpApi::new(&srv.url, API_KEY);
    let raw = |s: &str| serde_json::value::RawValue::from_string(s.to_owned()).unwrap();
    let item = |channel: &str, data: &str, key: Option<&str>| MessageItem {
        channel: channel.into(),
        channels: vec![],
        data: raw(data),
        meta: None,
        idempotency_key: key.map(str::to_owned),
        deliver_at: None,
        delay_ms: None,
    };
    let results = api
        .publish_messages(vec![item("chat:h1", r#"{"a": 1}"#, Some("k")), item("nope:h1", "2", None)])
        .await
        .unwrap();
    assert!(
        matches!(&results[0], MessageResult::Published { seq: Some(1), replayed: false, .. }),
        "{results:?}"
    );
    assert!(matches!(&results[1], MessageResult::Failed { error, .. } if error.code == "unknown_namespace"));
    let again = api.publish_messages(vec![item("chat:h1", r#"{"a": 1}"#, Some("k"))]).await.unwrap();
    assert!(again[0].is_replayed());
    let refused = api.publish_messages(vec![]).await.unwrap_err();
    assert!(refused.to_string().contains("400") || format!("{refused:?}").contains("400"), "{refused:?}");
}

#[tokio::test]
async fn the_immediate_messages_share_one_group_commit() {
    let srv = TestServer::start().await;
    let before = srv.engine.stats();
    let messages: Vec<Value> = (0..200)
        .map(|i| json!({ "channel": format!("chat:g{}", i % 7), "data": i, "idempotency_key": format!("g{i}") }))
        .collect();
    let r = post_messages(&srv, json!(messages)).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let after = srv.engine.stats();
    assert_eq!(after.appends - before.appends, 200);
    // One submission: one group commit (a background write may share the
    // window; one commit per message would be 200).
    let commits = after.batches - before.batches;
    assert!((1..=2).contains(&commits), "{commits} group commits for one request");
}

#[tokio::test]
async fn a_message_to_several_channels_is_answered_per_channel() {
    let srv = TestServer::start().await;
    let mut sub = srv.connect("reader").await;
    sub.subscribe("chat:f1", None).await.unwrap();
    sub.subscribe("chat:f2", None).await.unwrap();
    let before = srv.engine.stats();
    let r = post_messages(
        &srv,
        json!([
            { "channel": "chat:f1", "data": "one" },
            { "channels": ["chat:f1", "chat:f2"], "data": "both" },
            { "channel": "chat:f1", "channels": ["chat:f2"], "data": 0 },
            { "data": 0 },
            { "channels": ["chat:f2", "chat:f2"], "data": 0 },
            { "channels": ["chat:f2", "nope:f2"], "data": 0 },
        ]),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let res = &r.body["results"];
    assert_eq!(res[0]["seq"], 1, "{res}");
    let fanned = res[1]["results"].as_array().expect("one result per channel");
    assert_eq!(
        fanned.iter().map(|c| (c["channel"].clone(), c["seq"].clone())).collect::<Vec<_>>(),
        vec![(json!("chat:f1"), json!(2)), (json!("chat:f2"), json!(1))]
    );
    // Malformed messages fail alone, every channel named in the result.
    assert_eq!(res[2]["results"][0]["error"]["code"], "bad_request", "both `channel` and `channels`: {res}");
    assert_eq!(res[3]["error"]["code"], "bad_request", "neither: {res}");
    assert_eq!(res[4]["results"][1]["error"]["code"], "bad_request", "a channel named twice: {res}");
    // As `/publish`: every channel checked before any is appended.
    assert_eq!(res[5]["results"][0]["error"]["code"], "unknown_namespace", "{res}");
    assert_eq!(res[5]["results"][1]["error"]["code"], "unknown_namespace", "{res}");
    // The unkeyed appends of the request are one submission.
    let after = srv.engine.stats();
    assert_eq!(after.appends - before.appends, 3);
    assert!((1..=2).contains(&(after.batches - before.batches)));

    let got = next_messages(&mut sub, 3).await;
    let seen: Vec<(String, Value)> =
        got.iter().map(|m| (m.channel.clone().unwrap_or_default(), data(m))).collect();
    assert!(seen.contains(&("chat:f2".into(), json!("both"))), "{seen:?}");
    assert_eq!(srv.history("chat:f1").await.len(), 2);
    assert_eq!(srv.history("chat:f2").await.len(), 1);
}

#[tokio::test]
async fn a_keyed_message_to_several_channels_is_the_publish_endpoints_request() {
    let srv = TestServer::start().await;
    let m = json!({ "channels": ["chat:k1", "chat:k2"], "data": { "x": 1 }, "idempotency_key": "fan" });
    let first = post_messages(&srv, json!([m.clone()])).await;
    let results = first.body["results"][0]["results"].as_array().expect("per channel").clone();
    assert_eq!(results.len(), 2, "{}", first.body);
    assert!(results.iter().all(|c| c["seq"] == 1 && c.get("replayed").is_none()), "{results:?}");
    assert!(first.headers.get("idempotent-replayed").is_none());

    // Retried whole: replayed on every channel, nothing appended twice.
    let again = post_messages(&srv, json!([m.clone()])).await;
    let replay = again.body["results"][0]["results"].as_array().unwrap();
    assert!(replay.iter().all(|c| c["replayed"] == true), "{}", again.body);
    assert_eq!(replay[1]["id"], results[1]["id"]);
    // The same key on `POST /api/v1/publish` names the same request.
    let via_publish = srv
        .call(
            "POST",
            "/api/v1/publish",
            Some(json!({ "channels": ["chat:k1", "chat:k2"], "data": { "x": 1 } })),
            &[("Idempotency-Key", "fan")],
        )
        .await;
    assert_eq!(via_publish.body["results"][0]["id"], results[0]["id"], "{}", via_publish.body);
    // Another request under the key (other channels) appends nothing.
    let other = post_messages(
        &srv,
        json!([{ "channels": ["chat:k1", "chat:k3"], "data": { "x": 1 }, "idempotency_key": "fan" }]),
    )
    .await;
    assert_eq!(
        other.body["results"][0]["results"][0]["error"]["code"], "idempotency_key_reused",
        "{}",
        other.body
    );
    assert!(srv.history("chat:k3").await.is_empty());
    assert_eq!(srv.history("chat:k1").await.len(), 1);

    // Scheduled to several channels: one schedule per channel.
    let later = post_messages(
        &srv,
        json!([{ "channels": ["chat:k1", "chat:k2"], "data": "later", "delay_ms": 100 }]),
    )
    .await;
    let sched = later.body["results"][0]["results"].as_array().unwrap();
    assert!(sched.iter().all(|c| c["scheduled_id"].is_string()), "{}", later.body);
    assert_eq!(sched[1]["channel"], "chat:k2");
    assert_eventually("the schedules delivered", || async { srv.history("chat:k2").await.len() == 2 }).await;
}
