//! The SQL of a PostgreSQL consumer: every statement it runs on the
//! outbox, its dead-letter table and `herald_consumer_state`, built once
//! per connection from the configured names and the optional columns the
//! table has. Names are validated lowercase identifiers (config.rs),
//! written into the text as they are; values are always parameters.

use tokio_postgres::Client;

use crate::integration::consumers::{AfterPublish, ConsumerConfig};

/// Rows counted at most for `lag` and `scheduled_rows` (the counts are
/// bounded).
const LAG_COUNT_CAP: i64 = 100_000;

/// The SQL of one consumer, built once from its validated names (they are
/// lowercase identifiers, written into the text as they are).
pub(super) struct Sql {
    pub(super) read: String,
    pub(super) finish_published: String,
    pub(super) park: String,
    pub(super) delete: String,
    pub(super) lag: String,
    pub(super) parked_count: String,
    pub(super) state: String,
    /// With a `deliver_at` column: the milliseconds until the partition's
    /// earliest scheduled row is due (`NULL`: none).
    pub(super) next_due: Option<String>,
    /// With a `deliver_at` column: the partition's scheduled rows, counted
    /// up to [`LAG_COUNT_CAP`].
    pub(super) scheduled: Option<String>,
}

/// The optional columns of the outbox (and of its dead-letter table) that
/// the consumer reads when they exist.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Columns {
    pub(super) meta: bool,
    pub(super) idempotency_key: bool,
    pub(super) created_at: bool,
    /// `channels text[]`: more channels of a row.
    pub(super) channels: bool,
    /// `deliver_at timestamptz`: a row is read once this is past.
    pub(super) deliver_at: bool,
}

impl Columns {
    pub(super) fn of(names: &[String]) -> Self {
        let has = |c: &str| names.iter().any(|x| x == c);
        Columns {
            meta: has("meta"),
            idempotency_key: has("idempotency_key"),
            created_at: has("created_at"),
            channels: has("channels"),
            deliver_at: has("deliver_at"),
        }
    }

    /// The text a row's partition is the hash of: its `channel`, or with a
    /// `channels` column the first channel it names (`''` for none, so a
    /// row without channels is read, and parked, like any other).
    fn route(&self, alias: &str) -> String {
        if self.channels {
            format!("coalesce({alias}channel, {alias}channels[1], '')")
        } else {
            format!("{alias}channel")
        }
    }
}

/// The columns of a table (`to_regclass` of `table`).
pub(super) async fn columns_of(client: &Client, table: &str) -> Result<Vec<String>, tokio_postgres::Error> {
    Ok(client
        .query(
            "SELECT attname::text FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped",
            &[&table],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// The hash of a channel to its partition, the same in every statement.
fn partition_expr(column: &str) -> String {
    format!("mod(abs(hashtext({column})::bigint), $PARTS) = $PART")
}

/// Replace the `$PARTS`/`$PART` placeholders with positional parameters.
fn bind(sql: &str, parts: usize, part: usize) -> String {
    sql.replace("$PARTS", &format!("${parts}::bigint")).replace("$PART", &format!("${part}::bigint"))
}

impl Sql {
    pub(super) fn new(cfg: &ConsumerConfig, cols: Columns) -> Self {
        let t = &cfg.table;
        let dead = cfg.dead_letter();
        let state = state_table(cfg);
        let meta = if cols.meta { "t.meta::text" } else { "NULL::text" };
        let key = if cols.idempotency_key { "t.idempotency_key" } else { "NULL::text" };
        let channels = if cols.channels { "t.channels::text[]" } else { "NULL::text[]" };
        let unpublished = match cfg.after_publish {
            AfterPublish::Delete => "",
            AfterPublish::Mark => " AND t.herald_published_at IS NULL",
        };
        // Rows scheduled for later are not read (by PostgreSQL's clock).
        let due = if cols.deliver_at { " AND (t.deliver_at IS NULL OR t.deliver_at <= now())" } else { "" };
        let part = partition_expr(&cols.route("t."));
        let read = bind(
            &format!(
                "SELECT t.id, t.channel, {channels}, t.data::text, {meta}, {key} FROM {t} t \
                 WHERE t.id <= $1 AND {part}{unpublished}{due} ORDER BY t.id LIMIT $4"
            ),
            2,
            3,
        );
        let finish_published = match cfg.after_publish {
            AfterPublish::Delete => format!("DELETE FROM {t} WHERE id = ANY($1::bigint[])"),
            AfterPublish::Mark => {
                format!("UPDATE {t} SET herald_published_at = now() WHERE id = ANY($1::bigint[])")
            }
        };
        let meta_j = if cols.meta { "t.meta::jsonb" } else { "NULL::jsonb" };
        let created = if cols.created_at { "t.created_at::timestamptz" } else { "NULL::timestamptz" };
        let (dead_channels, dead_channels_v) =
            if cols.channels { (", channels", ", t.channels::text[]") } else { ("", "") };
        let park = format!(
            "INSERT INTO {dead} (consumer, id, channel{dead_channels}, data, meta, idempotency_key, created_at, code, error) \
             SELECT $1, t.id, t.channel{dead_channels_v}, t.data::jsonb, {meta_j}, {key}, {created}, p.code, p.error \
             FROM {t} t JOIN unnest($2::bigint[], $3::text[], $4::text[]) AS p(id, code, error) ON p.id = t.id \
             ON CONFLICT (consumer, id) DO NOTHING"
        );
        let lag = bind(
            &format!(
                "SELECT count(*) FROM (SELECT 1 FROM {t} t WHERE {part}{unpublished}{due} LIMIT {LAG_COUNT_CAP}) s"
            ),
            1,
            2,
        );
        let parked_count = bind(
            &format!(
                "SELECT count(*) FROM {dead} WHERE consumer = $1 AND {}",
                partition_expr(&cols.route(""))
            ),
            2,
            3,
        );
        let later = " AND t.deliver_at > now()";
        let next_due = cols.deliver_at.then(|| {
            bind(
                &format!(
                    "SELECT ceil(extract(epoch FROM min(t.deliver_at) - now()) * 1000)::bigint FROM {t} t \
                     WHERE {part}{unpublished}{later}"
                ),
                1,
                2,
            )
        });
        let scheduled = cols.deliver_at.then(|| {
            bind(
                &format!(
                    "SELECT count(*) FROM (SELECT 1 FROM {t} t WHERE {part}{unpublished}{later} LIMIT {LAG_COUNT_CAP}) s"
                ),
                1,
                2,
            )
        });
        Sql {
            read,
            finish_published,
            park,
            delete: format!("DELETE FROM {t} WHERE id = ANY($1::bigint[])"),
            lag,
            parked_count,
            state,
            next_due,
            scheduled,
        }
    }
}

/// `herald_consumer_state`, in the table's schema.
fn state_table(cfg: &ConsumerConfig) -> String {
    match cfg.table.rsplit_once('.') {
        Some((schema, _)) => format!("{schema}.herald_consumer_state"),
        None => "herald_consumer_state".to_owned(),
    }
}

/// The tables Herald creates if missing (it needs `CREATE` on the schema,
/// or an operator creates them first: docs/consumers.md).
pub(super) fn ddl(cfg: &ConsumerConfig) -> [String; 2] {
    [
        format!(
            "CREATE TABLE IF NOT EXISTS {} (consumer text NOT NULL, id bigint NOT NULL, channel text, \
             channels text[], data jsonb, meta jsonb, idempotency_key text, created_at timestamptz, code text NOT NULL, \
             error text NOT NULL, parked_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (consumer, id))",
            cfg.dead_letter()
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS {} (consumer text NOT NULL, partition int NOT NULL, \
             fence bigint NOT NULL DEFAULT 0, last_id bigint, updated_at timestamptz NOT NULL DEFAULT now(), \
             PRIMARY KEY (consumer, partition))",
            state_table(cfg)
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sql_names_the_configured_tables_and_binds_the_partition() {
        let cfg = ConsumerConfig { name: "orders".into(), table: "shop.outbox".into(), ..Default::default() };
        let all = Columns { meta: true, idempotency_key: true, created_at: true, ..Columns::default() };
        let sql = Sql::new(&cfg, all);
        assert!(sql.read.contains("FROM shop.outbox t"), "{}", sql.read);
        assert!(sql.read.contains("mod(abs(hashtext(t.channel)::bigint), $2::bigint) = $3::bigint"));
        assert!(sql.park.starts_with("INSERT INTO shop.outbox_dead"));
        assert_eq!(sql.state, "shop.herald_consumer_state");
        assert!(sql.next_due.is_none() && sql.scheduled.is_none() && !sql.read.contains("deliver_at"));
        let plain = Sql::new(
            &ConsumerConfig { after_publish: AfterPublish::Mark, ..cfg.clone() },
            Columns::default(),
        );
        assert!(plain.read.contains("NULL::text, NULL::text"));
        assert!(plain.read.contains("herald_published_at IS NULL"));
        assert!(plain.finish_published.starts_with("UPDATE shop.outbox SET herald_published_at"));
        let both = Columns { channels: true, deliver_at: true, ..all };
        let sql = Sql::new(&cfg, both);
        let route =
            "mod(abs(hashtext(coalesce(t.channel, t.channels[1], ''))::bigint), $2::bigint) = $3::bigint";
        assert!(sql.read.contains(route), "{}", sql.read);
        assert!(sql.read.contains("t.deliver_at IS NULL OR t.deliver_at <= now()"), "{}", sql.read);
        assert!(sql.lag.contains("t.deliver_at <= now()"), "lag counts due rows only: {}", sql.lag);
        assert!(sql.park.contains("channel, channels, data"), "{}", sql.park);
        assert!(sql.parked_count.contains("coalesce(channel, channels[1], '')"), "{}", sql.parked_count);
        assert!(sql.next_due.unwrap().contains("t.deliver_at > now()"));
        assert!(sql.scheduled.unwrap().contains("t.deliver_at > now()"));
    }
}
