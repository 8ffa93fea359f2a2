//! socketioxide peer for `herald bench --peer socketioxide`: the Rust
//! Socket.IO server behind axum, with the same contract as the Node
//! Socket.IO peer (bench/peers/node/socketio-server.js):
//!
//! - a client emits `subscribe` with a channel name and an ack; the socket
//!   joins the room of that name and the ack answers `"ok"`;
//! - `POST /publish/{channel}` with a JSON body emits `msg` with it to the
//!   room, answering 201 once the emit returned;
//! - a client's `publish` event (channel, data) with an ack does the same
//!   and acks `"ok"` once the emit returned;
//! - `GET /version` names the versions.
//!
//! In-memory adapter, nothing stored, no resume.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use socketioxide::extract::{AckSender, Data, SocketRef};
use socketioxide::handler::ConnectHandler;
use socketioxide::SocketIo;

const VERSION: &str = "socketioxide 0.18.9 (axum 0.8)";

async fn publish(State(io): State<SocketIo>, Path(channel): Path<String>, body: String) -> (StatusCode, String) {
    let data: serde_json::Value = match serde_json::from_str(&body) {
        Ok(v) => v,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()),
    };
    match io.to(channel).emit("msg", &data).await {
        Ok(()) => (StatusCode::CREATED, "{}".into()),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn on_connect(_socket: SocketRef) {}

async fn register_listeners(socket: SocketRef) -> Result<(), std::convert::Infallible> {
    socket.on("subscribe", async |socket: SocketRef, Data::<String>(channel), ack: AckSender| {
        socket.join(channel);
        let _ = ack.send("ok");
    });
    socket.on(
        "publish",
        async |socket: SocketRef, Data::<(String, serde_json::Value)>((channel, data)), ack: AckSender| {
            // socketioxide runs each event's handler as its own task: a
            // socket's publishes are not emitted in the order it sent them.
            match socket.broadcast().to(channel).emit("msg", &data).await {
                Ok(()) => drop(ack.send("ok")),
                Err(e) => drop(ack.send(&format!("error: {e}"))),
            }
        },
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let port: u16 = std::env::args().nth(1).and_then(|p| p.parse().ok()).ok_or("usage: socketioxide-peer PORT")?;
    // A socket's send buffer holds as many packets as a Herald outbox
    // (websocket.outbox_capacity, 1,024) instead of 128: beyond it, emit fails
    // for that socket and the message is lost to it.
    let (layer, io) = SocketIo::builder().max_buffer_size(1024).build_layer();
    // socketioxide sends the connect reply before it runs the connect
    // handler, in a spawned task: an event the client sends right after
    // connecting can find no listener yet and is dropped (seen here under a
    // connect storm). Middlewares run before the reply, so the listener is
    // registered in one.
    io.ns("/", on_connect.with(register_listeners));
    let app = axum::Router::new()
        .route("/version", get(|| async { VERSION }))
        .route("/publish/{channel}", post(publish))
        .with_state(io)
        .layer(layer);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("socketioxide peer listening on {port} ({VERSION})");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
