//! The engine conformance suite (herald-core) against the Redis engine on a
//! single instance, one test per scenario, each on its own `redis-server`
//! (and its own key prefix, as on the shared cluster).

mod support;

use std::sync::Arc;

use herald_core::conformance::{self, Fixture};
use herald_core::Engine;
use support::RedisServer;

macro_rules! conformance_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                support::init_tracing();
                let redis = RedisServer::start();
                let engine: Arc<dyn Engine> = support::fixture_engine(&redis.url()).await;
                let fx = Fixture::new(engine);
                conformance::$name(&fx).await;
                fx.engine.close().await;
            }
        )*

        #[test]
        fn every_scenario_has_a_test() {
            let here: Vec<&str> = vec![$(stringify!($name)),*];
            let all: Vec<&str> = conformance::scenarios().into_iter().map(|(name, _)| name).collect();
            assert_eq!(here, all, "add the new scenario to this file");
        }
    };
}

conformance_tests![
    seqs_are_gap_free_per_channel,
    concurrent_appends_get_each_seq_once,
    duplicate_append_returns_original_receipt,
    reused_key_with_other_request_is_mismatch,
    concurrent_duplicates_append_once,
    read_pages_by_after_and_limit,
    max_len_trims_oldest,
    fanout_delivers_each_append_once_in_seq_order,
    volatile_appends_are_fanned_out_not_stored,
    stored_frames_are_the_fanned_out_frames,
    appends_after_close_are_refused,
    ack_is_cumulative_and_monotonic,
    cursor_is_absent_before_any_ack,
    cursors_are_per_device,
    cursors_lists_each_subscriber,
    user_cursors_lists_the_users_channels_only,
    concurrent_acks_end_at_the_max,
    presence_join_lists_counts_and_finds_users,
    presence_rejoin_reclaims_with_a_greater_token,
    presence_stale_tokens_have_no_effect,
    presence_renew_never_resurrects_a_swept_lease,
    presence_expire_returns_each_expired_lease_once,
    presence_tokens_stay_monotonic_without_leases,
    room_create_conflicts_with_an_existing_room,
    room_cas_admits_one_writer_per_version,
    room_versions_are_logged_in_order_with_messages,
    closing_a_room_seals_its_channel,
];
