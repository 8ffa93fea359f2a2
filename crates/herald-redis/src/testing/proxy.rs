//! A TCP proxy between a client (a node) and Redis, to cut the client off.

use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A TCP proxy in front of a Redis, that can cut a node off from it: while
/// cut, its connections are closed and new ones are closed at once.
pub struct RedisProxy {
    pub port: u16,
    cut_tx: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl RedisProxy {
    pub async fn start(target_port: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let (cut_tx, _) = watch::channel(false);
        let cut = cut_tx.clone();
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { continue };
                if *cut.borrow() {
                    continue; // dropped: closed at once
                }
                let mut cut_rx = cut.subscribe();
                conns.spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", target_port)).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        () = until_cut(&mut cut_rx) => {}
                    }
                });
                while conns.try_join_next().is_some() {}
            }
        });
        RedisProxy { port, cut_tx, task }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn cut(&self) {
        self.cut_tx.send_replace(true);
    }

    pub fn restore(&self) {
        self.cut_tx.send_replace(false);
    }
}

async fn until_cut(rx: &mut watch::Receiver<bool>) {
    // The sender lives as long as the proxy: an error means it is gone.
    let _ = rx.wait_for(|cut| *cut).await;
}

impl Drop for RedisProxy {
    fn drop(&mut self) {
        // Dropping the accept task drops its JoinSet: every connection ends.
        self.task.abort();
    }
}
