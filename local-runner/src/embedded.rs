//! The embedded DynamoDB emulator: when no endpoint is configured, the runner starts
//! dynoxide in-process on a free loopback port, its data in a local file, so that state
//! survives a restart and a demo needs no second service.

use std::path::Path;

use tokio::sync::oneshot;

/// A running embedded emulator; stops when dropped.
pub struct EmbeddedDynamo {
    endpoint: String,
    stop: Option<oneshot::Sender<()>>,
}

impl EmbeddedDynamo {
    /// Starts dynoxide on `127.0.0.1:<free port>` with its data in `db_path`.
    pub async fn start(db_path: &Path) -> Result<Self, String> {
        if let Some(dir) = db_path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let path = db_path
            .to_str()
            .ok_or_else(|| format!("state path {} is not UTF-8", db_path.display()))?;
        let db = dynoxide::Database::new(path)
            .map_err(|e| format!("cannot open the state database {path}: {e}"))?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("cannot bind a loopback port for the embedded DynamoDB: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("embedded DynamoDB has no address: {e}"))?
            .port();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            if let Err(e) = dynoxide::server::serve_with_shutdown(listener, db, shutdown).await {
                tracing::error!(error = %e, "embedded DynamoDB stopped");
            }
        });
        Ok(EmbeddedDynamo {
            endpoint: format!("http://127.0.0.1:{port}"),
            stop: Some(stop),
        })
    }

    /// The endpoint URL (`http://127.0.0.1:<port>`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

impl Drop for EmbeddedDynamo {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
