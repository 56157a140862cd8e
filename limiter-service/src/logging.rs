//! Both binaries log the same way: to stderr, at `info` unless `RUST_LOG` says otherwise.

/// Installs the log subscriber. Call once, first thing in `main`.
pub fn init() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
}
