//! `limiter-allocator`: splits each rule's global quota across LB hosts by demand.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context as _, Result};
use clap::{CommandFactory as _, Parser, Subcommand};
use limiter_allocator::{
    config::{self, Config, Election, Quota},
    coordination::{self, Replica},
    election::{Leadership, Role},
    hosts::HostLimits,
    listener::{self, ConnStats},
    service::{Refused, Service},
    state::{JoinerSizing, State},
};
use limiter_proto::{
    pb::allocator_server::AllocatorServer, server_config, server_tls_reloading, TlsFiles, TlsPaths,
    MAX_MESSAGE_BYTES,
};
use limiter_service::{
    cli_args::QuotaSetArgs,
    cli_docs::{self, CompletionsArgs, ManPagesArgs},
    control::Reply,
    exit::{self, Exit},
};
use tokio::{
    net::{TcpListener, UnixListener},
    signal::unix::{signal, SignalKind},
};

/// limiter-allocator: the fleet's quota allocator.
#[derive(Debug, Parser)]
// The command's name is the package's, `limiter-allocator`.
#[command(version, about, after_help = limiter_service::exit::HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: limiter_service::logging::LogArgs,
}

const DEFAULT_SOCKET: &str = config::DEFAULT_CONTROL_SOCKET;

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the allocator until SIGINT/SIGTERM.
    Run {
        /// Configuration file (TOML).
        #[arg(long)]
        config: PathBuf,
    },
    /// List or change global quotas at runtime (with replicas: in etcd, from any replica).
    #[command(subcommand)]
    Quota(QuotaCommand),
    /// Sharded allocators: which group grants which rule (in etcd, from any replica).
    #[command(subcommand)]
    Shard(ShardCommand),
    /// This allocator's role (alone, leader or follower), term, leader and etcd state.
    Status {
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
    },
    /// Check a configuration file as `run` would (its TLS files read too), changing
    /// nothing: exit status 0 when it would be accepted, 1 with every problem (by file,
    /// line, column and field) when not.
    Check {
        /// Configuration file (TOML).
        #[arg(long)]
        config: PathBuf,
    },
    /// Print a shell completion script, e.g. `limiter-allocator completions bash`.
    Completions(CompletionsArgs),
    /// Write the man pages into a directory (packaging: `cargo xtask dist`).
    #[command(hide = true)]
    ManPages(ManPagesArgs),
}

#[derive(Debug, Subcommand)]
enum QuotaCommand {
    /// Every rule's global quota.
    List {
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
    },
    /// Change a rule's global quota (hosts get new shares with their next report).
    Set {
        #[command(flatten)]
        quota: QuotaSetArgs,
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum ShardCommand {
    /// Every rule's group, as etcd holds it.
    List {
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
    },
    /// Move a rule to a group (its old group stops granting it; the new one learns what
    /// hosts hold for a lease TTL, then grants). The group needs a quota for the rule.
    Assign {
        rule: String,
        group: String,
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
    },
}

use limiter_allocator::now_ns;

fn main() -> std::process::ExitCode {
    limiter_service::metrics::record_start();
    let cli = Cli::parse();
    let format = cli.log.log_format;
    limiter_service::logging::init(format);
    // `check` keeps its contract: 0 accepted, 1 rejected, whatever the reason.
    let checking = matches!(cli.command, Command::Check { .. });
    let result = match cli.command {
        Command::Run { config } => run(&config),
        Command::Check { config } => check(&config),
        Command::Completions(args) => {
            cli_docs::write_completions(Cli::command(), args.shell, &mut std::io::stdout());
            Ok(())
        }
        Command::ManPages(args) => cli_docs::write_man_pages(Cli::command(), &args.dir)
            .and_then(|()| {
                limiter_allocator::config::REFERENCE
                    .write_man_page(env!("CARGO_PKG_VERSION"), &args.dir)
            })
            .with_context(|| format!("writing man pages into {}", args.dir.display())),
        Command::Quota(QuotaCommand::List { socket }) => {
            control_call(&socket, &ControlRequest::List).map(|v| println!("{v}"))
        }
        Command::Shard(ShardCommand::List { socket }) => {
            control_call(&socket, &ControlRequest::ShardList).map(|v| println!("{v}"))
        }
        Command::Shard(ShardCommand::Assign {
            rule,
            group,
            socket,
        }) => control_call(&socket, &ControlRequest::ShardAssign { rule, group })
            .map(|v| println!("{v}")),
        Command::Status { socket } => {
            control_call(&socket, &ControlRequest::Status).map(|v| println!("{v}"))
        }
        Command::Quota(QuotaCommand::Set {
            quota: QuotaSetArgs { rule, rate, burst },
            socket,
        }) => control_call(&socket, &ControlRequest::Set { rule, rate, burst })
            .map(|v| println!("{v}")),
    };
    match result {
        Ok(()) => Exit::Success.into(),
        Err(e) => {
            let status = if checking {
                Exit::Failure
            } else {
                exit::classify(e.as_ref(), &exit_status)
            };
            let message = exit::render(e.as_ref());
            limiter_service::logging::failure(format, "limiter-allocator", &message, status.code());
            status.into()
        }
    }
}

/// The exit status of the allocator's own error types and of the control socket's
/// (limiter_service::control); limiter_service::exit knows I/O errors.
fn exit_status(e: &(dyn std::error::Error + 'static)) -> Option<Exit> {
    if let Some(status) = limiter_service::control::exit_status(e) {
        return Some(status);
    }
    if e.is::<limiter_config::ConfigError>() || e.is::<limiter_proto::TlsError>() {
        return Some(Exit::BadInput);
    }
    None
}

fn check(path: &Path) -> Result<()> {
    let config = Config::load(path)?;
    server_config(&TlsFiles {
        ca: &config.tls.ca,
        cert: &config.tls.cert,
        key: &config.tls.key,
    })
    .with_context(|| format!("{}: the tls files", path.display()))?;
    if let Some(tls) = config.election.as_ref().and_then(|e| e.tls.as_ref()) {
        limiter_allocator::coordination::tls_options(tls)
            .with_context(|| format!("{}: the etcd tls files", path.display()))?;
    }
    println!(
        "{}: ok: listen {}, {} quotas, lease_ttl_ms {}, report_interval_ms {}",
        path.display(),
        config.listen,
        config.quotas.len(),
        config.lease_ttl_ms,
        config.report_interval_ms
    );
    Ok(())
}

fn run(path: &Path) -> Result<()> {
    // First, while the process has one thread: the variable leaves the environment.
    let notifier = limiter_service::notify::Notifier::from_env();
    let config = Config::load(path)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(serve(config, notifier))
}

async fn serve(config: Config, notifier: limiter_service::notify::Notifier) -> Result<()> {
    // First: a second allocator, or something in the socket's way, is refused before
    // anything else happens. Held to the end; dropping it removes the socket if ours.
    let (instance, control) = claim_control(&config.control_socket)?;
    let limits = config.limits;
    let lease_ttl = Duration::from_millis(config.lease_ttl_ms);
    // Handshakes run in the listener, each in a task of its own under the connection's
    // deadline, so a slow one delays nobody else's.
    // Read again for every handshake once changed: renewed certificates need no restart.
    let tls = Arc::new(server_tls_reloading(TlsPaths {
        ca: config.tls.ca.clone(),
        cert: config.tls.cert.clone(),
        key: config.tls.key.clone(),
    })?);
    let mut initial = State::new(
        &config.quotas,
        lease_ttl,
        Duration::from_millis(config.report_interval_ms),
        HostLimits {
            max_hosts: limits.max_hosts,
            ttl_ns: u64::try_from(lease_ttl.as_nanos()).unwrap_or(u64::MAX),
            rate: limits.max_reports_per_s,
            burst: limits.max_reports_per_s,
        },
        now_ns(),
    );
    initial.set_fleet_size(
        config
            .fleet_size
            .map_or(JoinerSizing::Reported, JoinerSizing::Configured),
    );
    initial.set_credit_pct(config.credit_pct);
    initial.set_units(config.units.clone());
    let state = Arc::new(Mutex::new(initial));
    if let Some(election) = config.election.as_ref().filter(|e| e.shards.is_some()) {
        if let Ok(mut state) = state.lock() {
            state.shard_as(&election.name);
        }
    }
    let leadership = Arc::new(Mutex::new(match &config.election {
        Some(e) => Leadership::replica(e.ttl_ms.saturating_mul(1_000_000), e.advertise),
        None => Leadership::alone(),
    }));
    let (stop_replica, stopped) = tokio::sync::watch::channel(false);
    let replica = config.election.clone().map(|election| {
        tracing::info!(
            etcd = %election.etcd.join(", "),
            tls = election.tls.is_some(),
            group = %election.name,
            shards = election.shards.as_deref().unwrap_or("(not sharded)"),
            advertise = %election.advertise,
            "replica: electing the leader in etcd (a follower until it wins)"
        );
        if election.tls.is_none() {
            tracing::warn!(
                etcd = %election.etcd.join(", "),
                "etcd is reached in plain text ([election] has no ca): anyone who can \
                 reach etcd, or alter this traffic, can rewrite the quotas, win the \
                 election and grant any share, and move rules between groups; secure \
                 etcd and set ca (and cert, key)"
            );
        }
        tokio::spawn(
            Replica {
                election,
                seed: config.quotas.clone(),
                state: Arc::clone(&state),
                leadership: Arc::clone(&leadership),
            }
            .run(stopped),
        )
    });
    let refused = Arc::new(Refused::default());
    let conns = Arc::new(ConnStats::default());
    tokio::spawn(serve_control(
        control,
        Controls {
            state: Arc::clone(&state),
            leadership: Arc::clone(&leadership),
            election: config.election.clone(),
        },
    ));
    if let Some(addr) = config.metrics {
        let sources = MetricSources {
            state: Arc::clone(&state),
            refused: Arc::clone(&refused),
            conns: Arc::clone(&conns),
            tls: Arc::clone(&tls),
            leadership: Arc::clone(&leadership),
            rule_text: limiter_service::metrics::Cached::new(RULE_METRICS_MAX_AGE),
        };
        // A taken port is logged and tried again; it never stops the allocator.
        tokio::spawn(async move {
            let listener = limiter_service::metrics::bind(addr, "the allocator").await;
            serve_metrics(listener, sources).await;
        });
    }
    let service = AllocatorServer::new(Service::new(
        Arc::clone(&state),
        Arc::clone(&refused),
        limits.max_reports_per_s,
        Arc::clone(&leadership),
    ))
    .max_decoding_message_size(MAX_MESSAGE_BYTES)
    .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listening on {}", config.listen))?;
    tracing::info!(
        listen = %config.listen,
        quotas = config.quotas.len(),
        max_hosts = limits.max_hosts,
        max_connections = limits.max_connections,
        "allocator serving (mutual TLS)"
    );
    let mut term = signal(SignalKind::terminate())?;
    // The gRPC listener and the control socket are bound (connections queue until the
    // server below accepts them): systemd's start returns from here.
    notifier.ready(&format!(
        "serving {} quotas on {}; control socket {}",
        config.quotas.len(),
        config.listen,
        config.control_socket.display()
    ));
    // Memory per connection is bounded by these: MAX_STREAMS decoded messages of at most
    // MAX_MESSAGE_BYTES, and the HTTP/2 windows.
    const MAX_STREAMS: u32 = 4;
    let window = u32::try_from(MAX_MESSAGE_BYTES).unwrap_or(u32::MAX);
    tonic::transport::Server::builder()
        // Every call has a deadline on this side too: a stalled client cannot hold a slot.
        .timeout(Duration::from_secs(2))
        .concurrency_limit_per_connection(MAX_STREAMS as usize)
        .max_concurrent_streams(MAX_STREAMS)
        .initial_stream_window_size(window)
        .initial_connection_window_size(window)
        .http2_max_header_list_size(16 * 1024)
        // A peer that stops reading (or answering) is found by its unanswered pings and
        // closed within two lease TTLs; a daemon's HTTP/2 stack answers them on its own.
        .http2_keepalive_interval(Some(lease_ttl))
        .http2_keepalive_timeout(Some(lease_ttl))
        .add_service(service)
        .serve_with_incoming_shutdown(
            listener::incoming(listener, limits, Arc::clone(&conns), tls),
            async move {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
                tracing::info!("shutting down");
                notifier.stopping();
            },
        )
        .await
        .context("serving gRPC")?;
    // A leader gives its lease up: its successor wins at once, not a TTL later.
    let _ = stop_replica.send(true);
    if let Some(task) = replica {
        let _ = tokio::time::timeout(2 * coordination::REQUEST_TIMEOUT, task).await;
    }
    drop(instance);
    Ok(())
}

/// Claims the control socket (`limiter_instance`): its directory made 0700 only if
/// missing, a single-instance lock beside it, a dead socket replaced, anything else at
/// the path refused with what is in the way.
fn claim_control(path: &Path) -> Result<(limiter_instance::Instance, UnixListener)> {
    let claimed = limiter_instance::claim(path, "limiter-allocator")?;
    for dir in &claimed.report.created_dirs {
        tracing::info!(dir = %dir.display(), "created the control socket's directory (mode 0700)");
    }
    if claimed.report.replaced_stale {
        tracing::info!(socket = %path.display(), "replaced a stale control socket");
    }
    claimed
        .listener
        .set_nonblocking(true)
        .context("making the control socket non-blocking")?;
    let listener =
        UnixListener::from_std(claimed.listener).context("serving the control socket")?;
    Ok((claimed.instance, listener))
}

/// What the allocator's control socket takes (`limiter-allocator quota …`, `status`),
/// on limiter_service::control's transport (root peers only, size limit, timeouts).
#[derive(Debug, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(tag = "cmd", rename_all = "snake_case")]
enum ControlRequest {
    /// Every rule's global quota.
    List,
    /// Change (or add) a rule's global quota; `burst` absent keeps the current one.
    Set {
        rule: String,
        rate: u64,
        burst: Option<u64>,
    },
    /// The replica's role.
    Status,
    /// The rules' assignment to groups.
    ShardList,
    /// Move a rule to a group.
    ShardAssign { rule: String, group: String },
}

/// Who answers on the allocator's socket, for the client's errors.
const OWNER: &str = "limiter-allocator";

/// What the control socket acts on.
#[derive(Clone)]
struct Controls {
    state: Arc<Mutex<State>>,
    leadership: Arc<Mutex<Leadership>>,
    election: Option<Election>,
}

/// Serves the control socket for as long as the allocator runs, each connection on a
/// task of its own (`limiter_service::control::serve`): a `quota set` waiting on etcd,
/// or a client that sends nothing, holds only its own connection.
async fn serve_control(listener: UnixListener, controls: Controls) {
    let handle = move |request| {
        let controls = controls.clone();
        async move { control(request, &controls).await }
    };
    limiter_service::control::serve(listener, handle, std::future::pending()).await;
}

const POISONED: &str = "allocator state is poisoned; restart the allocator";

/// `shard list` and `shard assign`: with sharding only, in etcd.
async fn shard_control(request: ControlRequest, controls: &Controls) -> Reply {
    let Some((election, shards)) = controls
        .election
        .as_ref()
        .and_then(|e| e.shards.as_deref().map(|s| (e, s)))
    else {
        return Reply::refused(
            "this allocator is not sharded: [election] shards is not set in its config",
        );
    };
    match request {
        ControlRequest::ShardAssign { rule, group } => {
            for (what, name) in [("rule", &rule), ("group", &group)] {
                if !limiter_proto::valid_rule_name(name) {
                    return Reply::refused(format!(
                        "{what} {name:?}: a {what} name must be 1-{} bytes of [A-Za-z0-9._-]",
                        limiter_proto::MAX_RULE_LEN
                    ));
                }
            }
            match coordination::assign(election, shards, &rule, &group).await {
                Ok(()) => {
                    tracing::info!(%rule, %group, "rule assigned to a group in etcd");
                    Reply::data(serde_json::json!({ "rule": rule, "group": group }))
                }
                Err(e) => Reply::refused_as(
                    format!(
                        "rule not moved: the rules' assignment is kept in etcd, which did not \
                         take the change: {e:#}"
                    ),
                    Exit::Failure,
                ),
            }
        }
        _ => match coordination::list_assignment(election, shards).await {
            Ok(list) => Reply::data(
                list.into_iter()
                    .map(|(rule, group)| serde_json::json!({ "rule": rule, "group": group }))
                    .collect::<Vec<_>>(),
            ),
            Err(e) => Reply::refused_as(
                format!("the rules' assignment is kept in etcd, which did not answer: {e:#}"),
                Exit::Failure,
            ),
        },
    }
}

async fn control(request: ControlRequest, controls: &Controls) -> Reply {
    match request {
        ControlRequest::ShardList | ControlRequest::ShardAssign { .. } => {
            shard_control(request, controls).await
        }
        ControlRequest::Status => status(controls),
        ControlRequest::List => match &controls.election {
            None => match controls.state.lock() {
                Ok(state) => Reply::data(state.quotas()),
                Err(_) => Reply::refused_as(POISONED, Exit::Failure),
            },
            Some(election) => match coordination::list_quotas(election).await {
                Ok(quotas) => Reply::data(quotas),
                Err(e) => Reply::refused_as(
                    format!("the quotas are kept in etcd, which did not answer: {e:#}"),
                    Exit::Failure,
                ),
            },
        },
        ControlRequest::Set { rule, rate, burst } => {
            let current = match controls.state.lock() {
                Ok(state) => state.quotas().into_iter().find(|q| q.rule == rule),
                Err(_) => return Reply::refused_as(POISONED, Exit::Failure),
            };
            let Some(burst) = burst.or(current.map(|q| q.burst)) else {
                return Reply::refused(format!("rule {rule:?} is new: give --burst"));
            };
            let quota = Quota { rule, rate, burst };
            if let Err(e) = config::check_quota(&quota) {
                return Reply::refused(e.to_string());
            }
            if let Some(election) = &controls.election {
                // etcd first: a change that did not reach it reaches no replica, and
                // this one must not hold a quota the others do not.
                if let Err(e) = coordination::put_quota(election, &quota).await {
                    return Reply::refused_as(
                        format!(
                            "quota not changed: the quotas are kept in etcd, which did not \
                             take the change: {e:#}"
                        ),
                        Exit::Failure,
                    );
                }
            }
            match controls.state.lock() {
                Ok(mut state) => state.set_quota(&quota, now_ns()),
                Err(_) => return Reply::refused_as(POISONED, Exit::Failure),
            }
            tracing::info!(rule = %quota.rule, rate = quota.rate, burst = quota.burst, "quota set");
            Reply::data(quota)
        }
    }
}

fn status(controls: &Controls) -> Reply {
    let Ok(l) = controls.leadership.lock() else {
        return Reply::refused_as(POISONED, Exit::Failure);
    };
    let role = l.role(now_ns());
    let leader = match role {
        Role::Alone => None,
        Role::Leader { .. } => controls.election.as_ref().map(|e| e.advertise),
        Role::Follower { leader } => leader,
    };
    let term = role.term();
    Reply::data(serde_json::json!({
        "role": role.as_str(),
        "term": term,
        "leader": leader.map(|l| l.to_string()),
        "etcd": controls.election.as_ref().map(|e| e.etcd.clone()),
        "etcd_reachable": controls.election.as_ref().map(|_| l.etcd_reachable),
        "etcd_error": l.etcd_error.clone(),
        "etcd_tls": controls.election.as_ref().map(|e| e.tls.is_some()),
        "group": controls.election.as_ref().map(|e| e.name.clone()),
        "shards": controls.election.as_ref().and_then(|e| e.shards.clone()),
        "elections_won": l.elections_won,
        "step_downs": l.step_downs,
    }))
}

fn control_call(socket: &Path, request: &ControlRequest) -> Result<serde_json::Value> {
    Ok(limiter_service::control::call(socket, OWNER, request)?)
}

/// What the metrics endpoint reads.
struct MetricSources {
    state: Arc<Mutex<State>>,
    refused: Arc<Refused>,
    conns: Arc<ConnStats>,
    tls: Arc<limiter_proto::ServerTls>,
    leadership: Arc<Mutex<Leadership>>,
    /// The per-rule gauges, made under the state lock at most once a second: a flood of
    /// scrapes must not hold up the reports waiting for that lock.
    rule_text: limiter_service::metrics::Cached<Result<String, String>>,
}

/// How old the per-rule gauges a scrape gets may be.
const RULE_METRICS_MAX_AGE: Duration = Duration::from_millis(500);

impl MetricSources {
    /// The exposition text; a poisoned state is an error (a 500), never an empty page.
    fn render(&self, now: u64) -> Result<String, String> {
        use std::{fmt::Write as _, sync::atomic::Ordering::Relaxed};
        let poisoned = || "allocator state is poisoned".to_string();
        let mut out = self.rule_text.get_or(|| {
            let mut state = self.state.lock().map_err(|_| poisoned())?;
            Ok(state.rule_metrics(now))
        })?;
        let state = self.state.lock().map_err(|_| poisoned())?;
        out.push_str(&state.counter_metrics(now));
        let (fleet_full, host_rate) = (state.refused_fleet_full, state.refused_host_rate);
        drop(state);
        let r = &self.refused;
        let _ = writeln!(
            out,
            "# HELP limiter_allocator_refused_reports_total Reports refused, by reason: invalid \
             (malformed, or an unknown protocol version), identity (host id not the \
             certificate's), connection_rate and host_rate (max_reports_per_s), fleet_full \
             (max_hosts), not_leader (a replica that redirects).\n# TYPE limiter_allocator_refused_reports_total counter"
        );
        for (reason, v) in [
            ("invalid", r.invalid.load(Relaxed)),
            ("identity", r.identity.load(Relaxed)),
            ("connection_rate", r.connection_rate.load(Relaxed)),
            ("host_rate", host_rate),
            ("fleet_full", fleet_full),
            ("not_leader", r.not_leader.load(Relaxed)),
        ] {
            let _ = writeln!(
                out,
                "limiter_allocator_refused_reports_total{{reason=\"{reason}\"}} {v}"
            );
        }
        {
            let l = self
                .leadership
                .lock()
                .map_err(|_| "allocator leadership is poisoned".to_string())?;
            let role = l.role(now);
            let term = role.term();
            let _ = writeln!(
                out,
                "# HELP limiter_allocator_leader 1 while this allocator grants: the elected leader, or the only allocator.\n\
                 # TYPE limiter_allocator_leader gauge\nlimiter_allocator_leader {}\n\
                 # HELP limiter_allocator_term The term this replica leads in (the etcd revision it won at); 0 when not leading or alone.\n\
                 # TYPE limiter_allocator_term gauge\nlimiter_allocator_term {term}\n\
                 # HELP limiter_allocator_etcd_reachable 1 while the replica's last etcd session works; 0 alone.\n\
                 # TYPE limiter_allocator_etcd_reachable gauge\nlimiter_allocator_etcd_reachable {}\n\
                 # HELP limiter_allocator_elections_won_total Elections this replica won.\n\
                 # TYPE limiter_allocator_elections_won_total counter\nlimiter_allocator_elections_won_total {}\n\
                 # HELP limiter_allocator_step_downs_total Times this replica stopped leading (etcd lost, its lease gone).\n\
                 # TYPE limiter_allocator_step_downs_total counter\nlimiter_allocator_step_downs_total {}",
                u8::from(!matches!(role, Role::Follower { .. })),
                u8::from(l.etcd_reachable),
                l.elections_won,
                l.step_downs
            );
        }
        let c = &self.conns;
        let _ = writeln!(
            out,
            "# HELP limiter_allocator_connections Open gRPC connections (handshaking or not).\n\
             # TYPE limiter_allocator_connections gauge\nlimiter_allocator_connections {}\n\
             # HELP limiter_allocator_connections_accepted_total Connections accepted.\n\
             # TYPE limiter_allocator_connections_accepted_total counter\n\
             limiter_allocator_connections_accepted_total {}\n\
             # HELP limiter_allocator_connections_refused_total Connections closed at accept, by the bound reached.\n\
             # TYPE limiter_allocator_connections_refused_total counter\n\
             limiter_allocator_connections_refused_total{{limit=\"max_connections\"}} {}\n\
             limiter_allocator_connections_refused_total{{limit=\"max_connections_per_ip\"}} {}\n\
             # HELP limiter_allocator_connections_handshaking Open gRPC connections still in their TLS handshake.\n\
             # TYPE limiter_allocator_connections_handshaking gauge\n\
             limiter_allocator_connections_handshaking {}\n\
             # HELP limiter_allocator_connections_evicted_total Connections closed in their TLS handshake to make room for a newcomer (max_connections reached).\n\
             # TYPE limiter_allocator_connections_evicted_total counter\n\
             limiter_allocator_connections_evicted_total {}",
            c.open.load(Relaxed),
            c.accepted.load(Relaxed),
            c.refused_total.load(Relaxed),
            c.refused_per_ip.load(Relaxed),
            c.handshaking.load(Relaxed),
            c.evicted.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP limiter_allocator_tls_reloads_total Changes of the tls files taken into use (by the next handshake).\n\
             # TYPE limiter_allocator_tls_reloads_total counter\n\
             limiter_allocator_tls_reloads_total {}\n\
             # HELP limiter_allocator_tls_reload_failures_total Changes of the tls files that made no valid configuration (a file mid-rotation, unparsable, a key not matching its certificate): handshakes keep the last good one.\n\
             # TYPE limiter_allocator_tls_reload_failures_total counter\n\
             limiter_allocator_tls_reload_failures_total {}",
            self.tls.reloads(),
            self.tls.failures()
        );
        limiter_service::metrics::process_families(
            &mut out,
            "limiter_allocator_build_info",
            env!("CARGO_PKG_VERSION"),
        );
        Ok(out)
    }
}

/// Serves the allocator's metrics (limiter_service::metrics: concurrent, with timeouts) for the
/// life of the process.
async fn serve_metrics(listener: TcpListener, sources: MetricSources) {
    let render: limiter_service::metrics::Render = Arc::new(move || sources.render(now_ns()));
    limiter_service::metrics::serve(listener, render, std::future::pending()).await;
}
