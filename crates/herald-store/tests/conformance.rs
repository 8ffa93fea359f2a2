//! The engine conformance suite (herald-core) against the embedded engine,
//! one test per scenario, each on a fresh data dir.

use std::sync::Arc;

use herald_core::conformance::{self, Fixture};
use herald_core::Engine;
use herald_store::{EmbeddedEngine, StoreConfig};

/// A fresh engine in its own temp dir (removed when the guard drops, after
/// the engine).
struct Fresh {
    fx: Fixture,
    _dir: tempfile::TempDir,
}

fn fresh() -> Fresh {
    let dir = tempfile::tempdir().expect("temp dir");
    let engine = EmbeddedEngine::open(StoreConfig::new(dir.path())).expect("open engine");
    let engine: Arc<dyn Engine> = Arc::new(engine);
    Fresh { fx: Fixture::new(engine), _dir: dir }
}

macro_rules! conformance_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let f = fresh();
                conformance::$name(&f.fx).await;
                f.fx.engine.close().await;
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

/// `run_all` itself, with a factory that keeps every data dir alive until
/// the end of the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_all_passes() {
    let base = tempfile::tempdir().expect("temp dir");
    let next = std::sync::atomic::AtomicUsize::new(0);
    conformance::run_all(|| {
        let path = base.path().join(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed).to_string());
        async move {
            let engine = EmbeddedEngine::open(StoreConfig::new(path)).expect("open engine");
            Arc::new(engine) as Arc<dyn Engine>
        }
    })
    .await;
}
