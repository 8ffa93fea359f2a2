//! [`HttpApi`]'s calls of the backend's actions on users, and of the
//! channel and node lists (docs/protocol.md, "Users, channels and nodes").

use bytes::Bytes;
use herald_proto::{
    ActionReply, ChannelsReply, ConnectionInfo, ConnectionsReply, DisconnectBody, NodeView, NodesReply,
    RevokeBody, Since, UserSubscribeBody,
};
use http::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::HttpApi;
use crate::url::encode_path_segment;
use crate::ClientError;

impl HttpApi {
    /// `GET /api/v1/users/{user}/connections`: every node's.
    pub async fn user_connections(&self, user: &str) -> Result<Vec<ConnectionInfo>, ClientError> {
        let path = format!("/api/v1/users/{}/connections", encode_path_segment(user));
        let reply: ConnectionsReply = self.call(Method::GET, &path, None::<&()>).await?;
        Ok(reply.connections)
    }

    /// `POST /api/v1/users/{user}/disconnect`.
    pub async fn disconnect_user(
        &self,
        user: &str,
        body: &DisconnectBody,
    ) -> Result<ActionReply, ClientError> {
        let path = format!("/api/v1/users/{}/disconnect", encode_path_segment(user));
        self.call(Method::POST, &path, Some(body)).await
    }

    /// `POST /api/v1/users/{user}/revoke`: tokens issued before
    /// `issued_before_ms` are refused, their connections closed.
    pub async fn revoke_user(&self, user: &str, issued_before_ms: u64) -> Result<ActionReply, ClientError> {
        let path = format!("/api/v1/users/{}/revoke", encode_path_segment(user));
        self.call(Method::POST, &path, Some(&RevokeBody { issued_before_ms })).await
    }

    /// `POST /api/v1/users/{user}/subscriptions`: subscribe every open
    /// connection of the user (or of `device`) to `channel`, from after
    /// `since` or live.
    pub async fn subscribe_user(
        &self,
        user: &str,
        channel: &str,
        device: Option<&str>,
        since: Option<Since>,
    ) -> Result<ActionReply, ClientError> {
        let path = format!("/api/v1/users/{}/subscriptions", encode_path_segment(user));
        let body =
            UserSubscribeBody { channel: channel.to_owned(), device: device.map(str::to_owned), since };
        self.call(Method::POST, &path, Some(&body)).await
    }

    /// `DELETE /api/v1/users/{user}/subscriptions/{channel}`.
    pub async fn unsubscribe_user(&self, user: &str, channel: &str) -> Result<ActionReply, ClientError> {
        let path = format!(
            "/api/v1/users/{}/subscriptions/{}",
            encode_path_segment(user),
            encode_path_segment(channel)
        );
        self.call(Method::DELETE, &path, None::<&()>).await
    }

    /// `DELETE /api/v1/rooms/{room}/members/{user}`.
    pub async fn remove_member(&self, room: &str, user: &str) -> Result<ActionReply, ClientError> {
        let path =
            format!("/api/v1/rooms/{}/members/{}", encode_path_segment(room), encode_path_segment(user));
        self.call(Method::DELETE, &path, None::<&()>).await
    }

    /// `GET /api/v1/channels?pattern=&limit=&after=`: one page.
    pub async fn active_channels(
        &self,
        pattern: Option<&str>,
        limit: Option<u32>,
        after: Option<&str>,
    ) -> Result<ChannelsReply, ClientError> {
        let mut query = Vec::new();
        if let Some(p) = pattern {
            query.push(format!("pattern={}", encode_path_segment(p)));
        }
        if let Some(l) = limit {
            query.push(format!("limit={l}"));
        }
        if let Some(a) = after {
            query.push(format!("after={}", encode_path_segment(a)));
        }
        let mut path = "/api/v1/channels".to_owned();
        if !query.is_empty() {
            path.push('?');
            path.push_str(&query.join("&"));
        }
        self.call(Method::GET, &path, None::<&()>).await
    }

    /// `GET /api/v1/nodes`.
    pub async fn nodes(&self) -> Result<Vec<NodeView>, ClientError> {
        let reply: NodesReply = self.call(Method::GET, "/api/v1/nodes", None::<&()>).await?;
        Ok(reply.nodes)
    }

    /// A JSON call: the body encoded, a non-2xx answer an error, the reply
    /// decoded.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, ClientError> {
        let body = body.map(|b| Bytes::from(serde_json::to_vec(b).expect("request bodies serialise")));
        let headers: &[(&str, &str)] =
            if body.is_some() { &[("content-type", "application/json")] } else { &[] };
        let resp = self.request(method, path, headers, body).await?.error_for_status()?;
        serde_json::from_slice(&resp.body)
            .map_err(|e| ClientError::Protocol(format!("unexpected reply to {path}: {e}")))
    }
}
