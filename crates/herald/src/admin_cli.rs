//! `herald users …`, `herald channels` and `herald nodes`: the backend's
//! actions on users and the deployment's lists over the HTTP API, each
//! printing the server's JSON reply.

use anyhow::Context;
use herald_client::{DisconnectBody, HttpApi, Since};
use serde::Serialize;

const DEFAULT_URL: &str = "http://127.0.0.1:8700";

/// The server to call.
#[derive(Debug, clap::Args)]
pub struct Server {
    /// Server address
    #[arg(long, env = "HERALD_URL", default_value = DEFAULT_URL, global = true)]
    pub url: String,
    /// API key (not needed against a --dev server)
    #[arg(long, env = "HERALD_API_KEY", hide_env_values = true, global = true)]
    pub api_key: Option<String>,
}

impl Server {
    fn api(&self) -> HttpApi {
        match &self.api_key {
            Some(key) => HttpApi::new(&self.url, key.clone()),
            None => HttpApi::anonymous(&self.url),
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct UsersArgs {
    #[command(subcommand)]
    pub action: UserAction,
    #[command(flatten)]
    pub server: Server,
}

#[derive(Debug, clap::Subcommand)]
pub enum UserAction {
    /// List a user's open connections on every node
    Connections { user: String },
    /// Close a user's connections (all, one device's, or one)
    Disconnect {
        user: String,
        #[arg(long)]
        device: Option<String>,
        /// A connection id from `herald users connections`
        #[arg(long)]
        connection: Option<String>,
        /// Close with a code the clients do not reconnect after
        #[arg(long)]
        no_reconnect: bool,
        #[arg(long)]
        reason: Option<String>,
        /// Refuse the user (or the device) for this many seconds
        #[arg(long, value_name = "SECONDS")]
        ban: Option<u64>,
    },
    /// Refuse the user's tokens issued before a time (default: now) and
    /// close their connections as expired
    Revoke {
        user: String,
        /// ms since the Unix epoch
        #[arg(long, value_name = "MS")]
        issued_before: Option<u64>,
    },
    /// Subscribe every open connection of the user to a channel
    Subscribe {
        user: String,
        channel: String,
        #[arg(long)]
        device: Option<String>,
        /// Deliver from after this seq (live when absent)
        #[arg(long)]
        since: Option<u64>,
    },
    /// Unsubscribe the user's connections from a channel
    Unsubscribe { user: String, channel: String },
    /// Remove a member from a room (unsubscribed, lease ended, rejoin refused)
    RemoveFromRoom { room: String, user: String },
}

#[derive(Debug, clap::Args)]
pub struct ChannelsArgs {
    /// `*` matches any run of characters, e.g. 'chat:*'
    #[arg(long)]
    pub pattern: Option<String>,
    #[arg(long)]
    pub limit: Option<u32>,
    /// The `next` of the previous page
    #[arg(long)]
    pub after: Option<String>,
    #[command(flatten)]
    pub server: Server,
}

#[derive(Debug, clap::Args)]
pub struct NodesArgs {
    #[command(flatten)]
    pub server: Server,
}

fn print(v: &impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v).context("the reply serialises")?);
    Ok(())
}

pub async fn users(args: UsersArgs) -> anyhow::Result<()> {
    let api = args.server.api();
    match args.action {
        UserAction::Connections { user } => print(&api.user_connections(&user).await?),
        UserAction::Disconnect { user, device, connection, no_reconnect, reason, ban } => {
            let body =
                DisconnectBody { device, connection, reconnect: !no_reconnect, reason, ban_seconds: ban };
            print(&api.disconnect_user(&user, &body).await?)
        }
        UserAction::Revoke { user, issued_before } => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            print(&api.revoke_user(&user, issued_before.unwrap_or(now)).await?)
        }
        UserAction::Subscribe { user, channel, device, since } => {
            let since = since.map(|seq| Since { seq, epoch: None });
            print(&api.subscribe_user(&user, &channel, device.as_deref(), since).await?)
        }
        UserAction::Unsubscribe { user, channel } => print(&api.unsubscribe_user(&user, &channel).await?),
        UserAction::RemoveFromRoom { room, user } => print(&api.remove_member(&room, &user).await?),
    }
}

pub async fn channels(args: ChannelsArgs) -> anyhow::Result<()> {
    let api = args.server.api();
    print(&api.active_channels(args.pattern.as_deref(), args.limit, args.after.as_deref()).await?)
}

pub async fn nodes(args: NodesArgs) -> anyhow::Result<()> {
    print(&args.server.api().nodes().await?)
}
