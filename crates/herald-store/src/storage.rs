//! The only module that knows the storage library (fjall).
//!
//! The rest of the crate sees fifteen byte-keyed spaces ([`Space`]; the
//! sixteenth keyspace, `meta`, is read and written here at open only),
//! point reads, bounded range scans, consistent read views and one atomic
//! [`WriteSet`] commit.
//! Replacing fjall (for example with redb) means rewriting this file only.
//!
//! Properties the rest of the crate relies on, which a replacement must keep:
//! - a commit is atomic across spaces, also across a crash;
//! - a committed write becomes visible to readers only once it is as durable
//!   as the commit asked for (fjall writes and syncs its journal before it
//!   applies the batch to the memtables, under the journal lock), so a reader
//!   never sees a message that a crash could take back;
//! - a [`View`] sees one committed state across all spaces;
//! - a failed commit leaves nothing visible (fjall poisons itself after a
//!   journal error and refuses further writes).

use std::ops::{Bound, ControlFlow};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode, Readable, Slice};
use herald_core::Epoch;

use crate::codec::{ChannelMeta, KeyLayout};
use crate::StoreError;

/// Format of a new data dir; bumped on an incompatible layout change. Every
/// format listed in [`KeyLayout`]'s variants is still opened (`init_meta`).
const STORE_FORMAT: &[u8] = b"2";
/// The first format: log keys without the channel tag.
const STORE_FORMAT_1: &[u8] = b"1";
const META_FORMAT_KEY: &[u8] = b"format";
const META_EPOCH_KEY: &[u8] = b"epoch";

/// The keyspaces of the data dir; see the crate docs for their layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Space {
    Log,
    Channels,
    Idem,
    IdemExp,
    Cursors,
    UserCursors,
    Presence,
    PresenceExp,
    PresenceTokens,
    Rooms,
    RoomsActive,
    Schedules,
    SchedulesDue,
    SchedulesByChannel,
    Control,
}

/// A storage failure. Any of these puts the engine into fail-stop.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum StorageError {
    #[error("storage I/O error: {0}")]
    Backend(String),
    #[error("corrupt store: {0}")]
    Corrupt(String),
    #[error("injected storage failure")]
    Injected,
}

impl From<fjall::Error> for StorageError {
    fn from(e: fjall::Error) -> Self {
        Self::Backend(e.to_string())
    }
}

impl From<crate::codec::CodecError> for StorageError {
    fn from(e: crate::codec::CodecError) -> Self {
        Self::Corrupt(e.to_string())
    }
}

/// Writes staged for one atomic commit. The last write to a key wins, so a
/// key is never both inserted and removed in one storage batch (fjall gives
/// every item of a batch the same sequence number, which would make the
/// outcome of a put and a delete of one key ambiguous).
///
/// Keys and values are held as the storage engine's own byte slices, so the
/// commit hands them over without another copy; [`WriteSet::put_with`]
/// builds one in a buffer the set reuses, so an append's log key and value
/// cost one allocation each (the stored copy), not two.
///
/// Hashed with foldhash (randomly seeded per process): this map is on the
/// path of every append, and it lives for one batch, so its size is bounded
/// by the batch.
#[derive(Default)]
pub(crate) struct WriteSet {
    ops: foldhash::HashMap<(Space, Slice), Option<Slice>>,
    /// Where [`WriteSet::put_with`] and [`WriteSet::delete_with`] build.
    scratch: Vec<u8>,
}

impl WriteSet {
    /// Room for about `keys` distinct keys without growing (a batch's
    /// appends write a few keys each: growing the map step by step rehashes
    /// every key staged so far each time).
    pub fn with_capacity(keys: usize) -> Self {
        Self {
            ops: foldhash::HashMap::with_capacity_and_hasher(keys, Default::default()),
            scratch: Vec::new(),
        }
    }

    pub fn put(&mut self, space: Space, key: impl Into<Slice>, value: impl Into<Slice>) {
        self.ops.insert((space, key.into()), Some(value.into()));
    }

    pub fn delete(&mut self, space: Space, key: impl Into<Slice>) {
        self.ops.insert((space, key.into()), None);
    }

    /// [`WriteSet::put`] of a key and a value that `key` and `value` write
    /// (into an empty buffer each).
    pub fn put_with(
        &mut self,
        space: Space,
        key: impl FnOnce(&mut Vec<u8>),
        value: impl FnOnce(&mut Vec<u8>),
    ) {
        let key = self.built(key);
        let value = self.built(value);
        self.ops.insert((space, key), Some(value));
    }

    /// [`WriteSet::delete`] of a key that `key` writes.
    pub fn delete_with(&mut self, space: Space, key: impl FnOnce(&mut Vec<u8>)) {
        let key = self.built(key);
        self.ops.insert((space, key), None);
    }

    fn built(&mut self, write: impl FnOnce(&mut Vec<u8>)) -> Slice {
        self.scratch.clear();
        write(&mut self.scratch);
        Slice::new(&self.scratch)
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// What this set will leave at `key`: `None` when it does not touch
    /// the key, `Some(None)` when it deletes it. Lets the writer read its
    /// own batch (a renew after a join of the same batch sees the join).
    pub fn staged(&self, space: Space, key: &[u8]) -> Option<Option<&[u8]>> {
        self.ops.get(&(space, Slice::new(key))).map(|v| v.as_deref())
    }

    /// Every key of `space` starting with `prefix` that this set touches,
    /// with what it leaves there (unordered).
    pub fn staged_with_prefix<'a>(
        &'a self,
        space: Space,
        prefix: &'a [u8],
    ) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + 'a {
        self.ops
            .iter()
            .filter(move |((s, k), _)| *s == space && k.starts_with(prefix))
            .map(|((_, k), v)| (&**k, v.as_deref()))
    }

    /// Distinct keys written so far.
    pub fn len(&self) -> usize {
        self.ops.len()
    }
}

pub(crate) struct Storage {
    db: Database,
    log: Keyspace,
    channels: Keyspace,
    idem: Keyspace,
    idem_exp: Keyspace,
    cursors: Keyspace,
    user_cursors: Keyspace,
    presence: Keyspace,
    presence_exp: Keyspace,
    presence_tokens: Keyspace,
    rooms: Keyspace,
    rooms_active: Keyspace,
    schedules: Keyspace,
    schedules_due: Keyspace,
    schedules_by_channel: Keyspace,
    control: Keyspace,
    epoch: Epoch,
    /// The key layout of this data dir's format (`log` and `channels`).
    key_layout: KeyLayout,
    /// Test hook: the next commit fails without writing.
    fail_next_commit: AtomicBool,
}

impl Storage {
    /// Open or create the data dir. Fails with [`StoreError::Locked`] if
    /// another engine (in this or another process) has it open.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        Self::open_new_as(dir, STORE_FORMAT)
    }

    /// [`Storage::open`], creating a new data dir in `format` (tests make
    /// data dirs of an older format with it).
    pub(crate) fn open_new_as(dir: &Path, format: &'static [u8]) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir)
            .map_err(|source| StoreError::CreateDir { path: dir.to_path_buf(), source })?;
        let db = Database::builder(dir).open().map_err(|e| open_error(dir, e))?;
        let space =
            |name: &str| db.keyspace(name, KeyspaceCreateOptions::default).map_err(|e| open_error(dir, e));
        let meta = space("meta")?;
        let (epoch, key_layout) = init_meta(&db, &meta, format).map_err(|e| match e {
            StorageError::Corrupt(m) => StoreError::Corrupt(m),
            other => StoreError::Storage(other.to_string()),
        })?;
        Ok(Self {
            log: space("log")?,
            channels: space("channels")?,
            idem: space("idem")?,
            idem_exp: space("idem_exp")?,
            // Not part of the store format: a data dir without them opens
            // with them empty, and a binary that does not know them never
            // opens them.
            cursors: space("cursors")?,
            user_cursors: space("user_cursors")?,
            presence: space("presence")?,
            presence_exp: space("presence_exp")?,
            presence_tokens: space("presence_tokens")?,
            rooms: space("rooms")?,
            rooms_active: space("rooms_active")?,
            schedules: space("schedules")?,
            schedules_due: space("schedules_due")?,
            schedules_by_channel: space("schedules_by_channel")?,
            control: space("control")?,
            epoch,
            key_layout,
            db,
            fail_next_commit: AtomicBool::new(false),
        })
    }

    /// How this data dir's `log` and `channels` keys are laid out.
    pub(crate) fn key_layout(&self) -> KeyLayout {
        self.key_layout
    }

    /// The epoch of this data dir, created with it.
    pub fn epoch(&self) -> &Epoch {
        &self.epoch
    }

    fn keyspace(&self, space: Space) -> &Keyspace {
        match space {
            Space::Log => &self.log,
            Space::Channels => &self.channels,
            Space::Idem => &self.idem,
            Space::IdemExp => &self.idem_exp,
            Space::Cursors => &self.cursors,
            Space::UserCursors => &self.user_cursors,
            Space::Presence => &self.presence,
            Space::PresenceExp => &self.presence_exp,
            Space::PresenceTokens => &self.presence_tokens,
            Space::Rooms => &self.rooms,
            Space::RoomsActive => &self.rooms_active,
            Space::Schedules => &self.schedules,
            Space::SchedulesDue => &self.schedules_due,
            Space::SchedulesByChannel => &self.schedules_by_channel,
            Space::Control => &self.control,
        }
    }

    /// A consistent read view across all spaces, for readers that must not
    /// see half of a commit.
    pub fn view(&self) -> View<'_> {
        View { storage: self, snapshot: self.db.snapshot() }
    }

    /// Apply `ws` atomically. With `sync`, the journal is fsynced before the
    /// writes become visible; without it they reach the OS page cache
    /// (survive a process crash, not a power loss).
    pub fn commit(&self, ws: WriteSet, sync: bool) -> Result<(), StorageError> {
        if self.fail_next_commit.swap(false, Ordering::SeqCst) {
            return Err(StorageError::Injected);
        }
        if ws.is_empty() {
            return Ok(());
        }
        let mode = if sync { PersistMode::SyncAll } else { PersistMode::Buffer };
        let mut batch = self.db.batch().durability(Some(mode));
        for ((space, key), value) in ws.ops {
            let ks = self.keyspace(space);
            match value {
                Some(v) => batch.insert(ks, key, v),
                None => batch.remove(ks, key),
            }
        }
        batch.commit()?;
        Ok(())
    }

    /// Fsync everything written so far.
    pub fn sync(&self) -> Result<(), StorageError> {
        self.db.persist(PersistMode::SyncAll)?;
        Ok(())
    }

    pub fn inject_commit_failure(&self) {
        self.fail_next_commit.store(true, Ordering::SeqCst);
    }
}

/// A consistent snapshot of every space.
pub(crate) struct View<'a> {
    storage: &'a Storage,
    snapshot: fjall::Snapshot,
}

/// Point reads, range scans and channel metas of committed state, written
/// once for both sources: the latest state ([`Storage`]; the writer thread
/// only, which as the only committer always reads its own complete state)
/// and a consistent snapshot ([`View`]).
pub(crate) trait Read {
    /// The store read from (its keyspaces and key layout).
    fn storage(&self) -> &Storage;

    /// The value at `key` in `ks`, from this source.
    fn point(&self, ks: &Keyspace, key: &[u8]) -> fjall::Result<Option<Slice>>;

    /// The entries of `ks` in `range`, from this source.
    fn range(&self, ks: &Keyspace, range: KeyRange) -> fjall::Iter;

    fn get(&self, space: Space, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.point(self.storage().keyspace(space), key)?.map(|v| v.to_vec()))
    }

    /// Visit keys in `range` in ascending order until `f` breaks.
    fn scan(
        &self,
        space: Space,
        range: KeyRange,
        mut f: impl FnMut(&[u8], &[u8]) -> Result<ControlFlow<()>, StorageError>,
    ) -> Result<(), StorageError> {
        for guard in self.range(self.storage().keyspace(space), range) {
            let (k, v) = guard.into_inner()?;
            if f(&k, &v)?.is_break() {
                break;
            }
        }
        Ok(())
    }

    /// `channel`'s stored meta (the default for a channel never written),
    /// with `head` raised to the channel's last log entry where the layout
    /// lets the stored head lag ([`KeyLayout::lazy_head`]; a closed
    /// channel's meta is exact). One reverse seek past the stored head.
    fn channel_meta(&self, channel: &str) -> Result<ChannelMeta, StorageError> {
        let layout = self.storage().key_layout;
        let mut meta = match self.get(Space::Channels, &layout.channel_key(channel))? {
            Some(v) => ChannelMeta::decode(&v)?,
            None => ChannelMeta::default(),
        };
        if layout.lazy_head() && !meta.closed {
            let log = layout.log(channel);
            let range = (Bound::Excluded(log.key(meta.head)), Bound::Included(log.key(u64::MAX)));
            if let Some(guard) = self.range(&self.storage().log, range).next_back() {
                meta.head = meta.head.max(log.seq(&guard.key()?)?);
            }
        }
        Ok(meta)
    }
}

impl Read for Storage {
    fn storage(&self) -> &Storage {
        self
    }

    fn point(&self, ks: &Keyspace, key: &[u8]) -> fjall::Result<Option<Slice>> {
        ks.get(key)
    }

    fn range(&self, ks: &Keyspace, range: KeyRange) -> fjall::Iter {
        ks.range(range)
    }
}

impl Read for View<'_> {
    fn storage(&self) -> &Storage {
        self.storage
    }

    fn point(&self, ks: &Keyspace, key: &[u8]) -> fjall::Result<Option<Slice>> {
        self.snapshot.get(ks, key)
    }

    fn range(&self, ks: &Keyspace, range: KeyRange) -> fjall::Iter {
        self.snapshot.range(ks, range)
    }
}

pub(crate) type KeyRange = (Bound<Vec<u8>>, Bound<Vec<u8>>);

/// Check the data dir's format and read its epoch, creating both (durably)
/// in a new data dir.
fn init_meta(db: &Database, meta: &Keyspace, new_format: &[u8]) -> Result<(Epoch, KeyLayout), StorageError> {
    let layout_of = |format: &[u8]| match format {
        STORE_FORMAT => Some(KeyLayout::Tagged),
        STORE_FORMAT_1 => Some(KeyLayout::Plain),
        _ => None,
    };
    let layout = match meta.get(META_FORMAT_KEY)? {
        Some(f) => layout_of(&f).ok_or_else(|| {
            StorageError::Corrupt(format!(
                "data dir format {:?} is not supported (this version reads {:?} and {:?})",
                String::from_utf8_lossy(&f),
                String::from_utf8_lossy(STORE_FORMAT_1),
                String::from_utf8_lossy(STORE_FORMAT)
            ))
        })?,
        None => {
            // A new data dir: a new epoch, so clients resuming with seqs of
            // another (lost) log resync instead of trusting them.
            let epoch = uuid::Uuid::new_v4().hyphenated().to_string();
            let mut batch = db.batch().durability(Some(PersistMode::SyncAll));
            batch.insert(meta, META_FORMAT_KEY, new_format);
            batch.insert(meta, META_EPOCH_KEY, epoch.as_bytes());
            batch.commit()?;
            layout_of(new_format).expect("a known format")
        }
    };
    let epoch = meta
        .get(META_EPOCH_KEY)?
        .ok_or_else(|| StorageError::Corrupt("data dir has a format marker but no epoch".into()))?;
    let epoch = std::str::from_utf8(&epoch)
        .map_err(|_| StorageError::Corrupt("epoch is not UTF-8".into()))?
        .to_owned();
    Ok((Epoch::new(epoch), layout))
}

fn open_error(dir: &Path, e: fjall::Error) -> StoreError {
    match e {
        fjall::Error::Locked => StoreError::Locked { path: PathBuf::from(dir) },
        other => StoreError::Storage(format!("cannot open {}: {other}", dir.display())),
    }
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;
    use std::time::Duration;

    use herald_core::{AppendRequest, Lifecycle, Log, Retention};
    use herald_proto::ChannelName;
    use serde_json::value::RawValue;

    use super::*;
    use crate::{EmbeddedEngine, StoreConfig};

    fn req(channel: &ChannelName, data: &str) -> AppendRequest {
        let data = RawValue::from_string(data.to_owned()).expect("JSON");
        AppendRequest::message(channel.clone(), data, true, Retention { max_len: 3, max_age: None })
    }

    /// Every key of one space of the data dir.
    fn keys_of(dir: &Path, space: Space) -> Vec<Vec<u8>> {
        let storage = Storage::open(dir).expect("open");
        let mut keys = Vec::new();
        storage
            .scan(space, (Bound::Unbounded, Bound::Unbounded), |k, _| {
                keys.push(k.to_vec());
                Ok(ControlFlow::Continue(()))
            })
            .expect("scan");
        keys
    }

    /// A data dir of each format opens, appends (with trimming), reads and
    /// reopens in its own key layout: format 1 untagged, format 2 (new data
    /// dirs) tagged.
    #[tokio::test]
    async fn each_format_keeps_its_key_layout() {
        let ch = ChannelName::new("chat:layout").unwrap();
        for (format, layout) in [(STORE_FORMAT_1, KeyLayout::Plain), (STORE_FORMAT, KeyLayout::Tagged)] {
            let dir = tempfile::tempdir().unwrap();
            drop(Storage::open_new_as(dir.path(), format).expect("create"));
            for round in 0..2 {
                let engine = EmbeddedEngine::open(StoreConfig::new(dir.path())).expect("open");
                for i in 1..=4 {
                    let seq = engine.append(req(&ch, &format!("{}", round * 4 + i))).await.unwrap().seq;
                    assert_eq!(seq, Some(round * 4 + i), "seqs continue across a reopen");
                }
                let page = engine.read(&ch, 0, 100).await.unwrap();
                let seqs: Vec<_> = page.messages.iter().map(|m| m.seq.unwrap()).collect();
                let head = round * 4 + 4;
                assert_eq!(seqs, (head - 2..=head).collect::<Vec<_>>(), "the last three, trimmed in place");
                engine.close().await;
                drop(engine);
            }
            assert_eq!(Storage::open(dir.path()).unwrap().key_layout(), layout);
            let keys = keys_of(dir.path(), Space::Log);
            let expected: Vec<_> = (6..=8).map(|seq| layout.log_key(ch.as_str(), seq)).collect();
            assert_eq!(keys, expected, "{layout:?}: exactly the live entries, in this layout");
            let tagged = keys.iter().all(|k| k.starts_with(&crate::codec::channel_tag(ch.as_str())));
            assert_eq!(tagged, layout == KeyLayout::Tagged);
            assert_eq!(keys_of(dir.path(), Space::Channels), [layout.channel_key(ch.as_str())]);
        }
    }

    /// The stored meta of `channel`, as it is on disk.
    fn stored_meta(dir: &Path, layout: KeyLayout, channel: &ChannelName) -> Option<ChannelMeta> {
        let storage = Storage::open(dir).expect("open");
        let v = storage.get(Space::Channels, &layout.channel_key(channel.as_str())).expect("get");
        v.map(|v| ChannelMeta::decode(&v).expect("decode"))
    }

    /// Format 2 writes a channel's meta only when more than its head
    /// changes; the head then comes from the log, for the readers and for
    /// the writer after a reopen (no seq is handed out twice). Format 1
    /// writes it with every append, as binaries that know only format 1
    /// expect.
    #[tokio::test]
    async fn a_format_2_head_is_read_from_the_log() {
        let ch = ChannelName::new("chat:lazy").unwrap();
        let append = |max_age: Option<Duration>| {
            let data = RawValue::from_string("1".to_owned()).unwrap();
            AppendRequest::message(ch.clone(), data, true, Retention { max_len: 0, max_age })
        };
        let hour = Some(Duration::from_secs(3600));
        for (format, layout) in [(STORE_FORMAT_1, KeyLayout::Plain), (STORE_FORMAT, KeyLayout::Tagged)] {
            let dir = tempfile::tempdir().unwrap();
            drop(Storage::open_new_as(dir.path(), format).expect("create"));
            let engine = EmbeddedEngine::open(StoreConfig::new(dir.path())).expect("open");
            for i in 1..=5 {
                assert_eq!(engine.append(append(None)).await.unwrap().seq, Some(i));
            }
            assert_eq!(engine.position(&ch).await.unwrap().head, 5, "{layout:?}: readers see the head");
            engine.close().await;
            drop(engine);
            let stored = stored_meta(dir.path(), layout, &ch).map(|m| m.head);
            let expected = if layout.lazy_head() { None } else { Some(5) };
            assert_eq!(stored, expected, "{layout:?}: only format 1 wrote a meta for head changes");

            let engine = EmbeddedEngine::open(StoreConfig::new(dir.path())).expect("reopen");
            assert_eq!(engine.position(&ch).await.unwrap().head, 5, "{layout:?}: the head after a reopen");
            // An age limit is written with the meta; later heads lag again.
            assert_eq!(engine.append(append(hour)).await.unwrap().seq, Some(6));
            assert_eq!(engine.append(append(hour)).await.unwrap().seq, Some(7));
            engine.close().await;
            drop(engine);
            let stored = stored_meta(dir.path(), layout, &ch).expect("written for the age limit");
            assert_eq!(stored.max_age, hour);
            assert_eq!(stored.head, if layout.lazy_head() { 6 } else { 7 }, "{layout:?}");

            let engine = EmbeddedEngine::open(StoreConfig::new(dir.path())).expect("reopen");
            assert_eq!(engine.append(append(hour)).await.unwrap().seq, Some(8), "{layout:?}: no seq twice");
            let page = engine.read(&ch, 0, 100).await.unwrap();
            assert_eq!((page.position.first, page.position.head), (1, 8));
            let seqs: Vec<_> = page.messages.iter().map(|m| m.seq.unwrap()).collect();
            assert_eq!(seqs, (1..=8).collect::<Vec<_>>());
            engine.close().await;
        }
    }

    /// A stored head two behind the log (format 2): the age sweep, after a
    /// reopen (nothing cached), still empties the whole log, and the head
    /// survives the log it emptied (the next append gets the next seq).
    #[tokio::test]
    async fn the_age_sweep_empties_a_log_whose_stored_head_lags() {
        let ch = ChannelName::new("chat:aged").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let append = || {
            let data = RawValue::from_string("1".to_owned()).unwrap();
            let retention = Retention { max_len: 0, max_age: Some(Duration::from_millis(300)) };
            AppendRequest::message(ch.clone(), data, true, retention)
        };
        let engine = EmbeddedEngine::open(StoreConfig::new(dir.path())).expect("open");
        for i in 1..=3 {
            assert_eq!(engine.append(append()).await.unwrap().seq, Some(i));
        }
        engine.close().await;
        drop(engine);
        assert_eq!(stored_meta(dir.path(), KeyLayout::Tagged, &ch).map(|m| m.head), Some(1));
        let config =
            StoreConfig { sweep_interval: Duration::from_millis(20), ..StoreConfig::new(dir.path()) };
        let engine = EmbeddedEngine::open(config).expect("reopen");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let p = engine.position(&ch).await.unwrap();
            if p.first == 4 {
                assert_eq!(p.head, 3);
                break;
            }
            assert!(std::time::Instant::now() < deadline, "not expired: {p:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        engine.close().await;
        drop(engine);
        let stored = stored_meta(dir.path(), KeyLayout::Tagged, &ch).expect("meta");
        assert_eq!((stored.first, stored.head), (4, 3), "the emptied log's head is in the meta");
        let engine = EmbeddedEngine::open(StoreConfig::new(dir.path())).expect("reopen");
        assert_eq!(engine.append(append()).await.unwrap().seq, Some(4));
        engine.close().await;
    }

    #[test]
    fn a_format_this_version_does_not_know_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = Database::builder(dir.path()).open().unwrap();
            let meta = db.keyspace("meta", KeyspaceCreateOptions::default).unwrap();
            meta.insert(META_FORMAT_KEY, b"9").unwrap();
            db.persist(PersistMode::SyncAll).unwrap();
        }
        let e = Storage::open(dir.path()).err().expect("refused").to_string();
        assert!(e.contains("format \"9\" is not supported"), "{e}");
    }
}
