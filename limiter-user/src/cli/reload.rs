use limiter_user::serve::control::{call, Request};
use serde_json::Value;

use super::SocketArg;

#[derive(Debug, clap::Args)]
pub struct ReloadArgs {
    #[command(flatten)]
    socket: SocketArg,
    /// Check the file and print what a reload would change (rules added, removed and
    /// changed, whose buckets would start over, keys that wait for a restart), changing
    /// nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print the daemon's answer as JSON.
    #[arg(long)]
    json: bool,
}

pub fn execute(args: ReloadArgs) -> anyhow::Result<()> {
    let request = if args.dry_run {
        Request::ReloadDryRun
    } else {
        Request::Reload
    };
    let r = call(&args.socket.socket, &request)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    print!("{}", render(&r, args.dry_run));
    Ok(())
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

/// The reload's answer as an operator reads it: one line per rule that changes.
fn render(r: &Value, dry_run: bool) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let plan = &r["plan"];
    let _ = writeln!(
        out,
        "{}: {} rules ({} added, {} removed, {} changed, {} unchanged)",
        if dry_run { "would reload" } else { "reloaded" },
        r["rules"],
        plan["added"].as_array().map_or(0, Vec::len),
        plan["removed"].as_array().map_or(0, Vec::len),
        plan["changed"].as_array().map_or(0, Vec::len),
        plan["unchanged"],
    );
    for rule in strings(&plan["added"]) {
        let _ = writeln!(out, "  + {rule}");
    }
    for rule in strings(&plan["removed"]) {
        let _ = writeln!(out, "  - {rule}");
    }
    for change in plan["changed"].as_array().into_iter().flatten() {
        let keys: Vec<String> = change["keys"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|k| {
                format!(
                    "{} {} -> {}",
                    k["key"].as_str().unwrap_or("?"),
                    k["from"].as_str().unwrap_or("?"),
                    k["to"].as_str().unwrap_or("?")
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "  ~ {}: {}",
            change["rule"].as_str().unwrap_or("?"),
            keys.join(", ")
        );
    }
    let restarts = plan["restarts"].as_array().into_iter().flatten();
    for restart in restarts {
        let what = match restart["state"].as_str() {
            Some("aggregate") => "aggregate bucket and counters start over",
            Some("per_source") => "per-source buckets start over (each source's burst once)",
            _ => "state starts over",
        };
        let _ = writeln!(
            out,
            "  {}: {what}: {}",
            restart["rule"].as_str().unwrap_or("?"),
            restart["why"].as_str().unwrap_or("?")
        );
    }
    for setting in plan["settings"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "  ~ {}: {} -> {}",
            setting["setting"].as_str().unwrap_or("?"),
            setting["from"].as_str().unwrap_or("?"),
            setting["to"].as_str().unwrap_or("?")
        );
    }
    let dropped = strings(&plan["quota_overrides_dropped"]);
    if !dropped.is_empty() {
        let _ = writeln!(
            out,
            "quota set overrides {}: {} (the file's rate applies)",
            if dry_run {
                "would be dropped"
            } else {
                "dropped"
            },
            dropped.join(", ")
        );
    }
    let later = strings(&r["needs_restart"]);
    if !later.is_empty() {
        let _ = writeln!(
            out,
            "changed, takes effect at the next start: {}",
            later.join(", ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dry_run_lists_every_change_and_restart() {
        let r = serde_json::json!({
            "rules": 3,
            "needs_restart": ["metrics"],
            "plan": {
                "added": ["api"],
                "removed": ["old"],
                "changed": [{"rule": "web", "keys": [
                    {"key": "rate", "from": "1000", "to": "2000"}
                ]}],
                "unchanged": 1,
                "restarts": [
                    {"rule": "api", "state": "aggregate", "why": "new rule"},
                    {"rule": "web", "state": "per_source", "why": "per-source limit changed"}
                ],
                "quota_overrides_dropped": ["dns"],
                "settings": [{"setting": "tunnels.eth1", "from": "-", "to": "[\"ipip\"]"}]
            }
        });
        let text = render(&r, true);
        assert_eq!(
            text,
            "would reload: 3 rules (1 added, 1 removed, 1 changed, 1 unchanged)\n  + api\n  - old\n  \
             ~ web: rate 1000 -> 2000\n  api: aggregate bucket and counters start over: new rule\n  \
             web: per-source buckets start over (each source's burst once): per-source limit \
             changed\n  ~ tunnels.eth1: - -> [\"ipip\"]\nquota set overrides would be dropped: dns (the file's rate applies)\n\
             changed, takes effect at the next start: metrics\n"
        );
        assert!(render(&r, false).starts_with("reloaded: 3 rules"));
    }
}
