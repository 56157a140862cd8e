use limiter_user::{
    attach::program::AttachedMode,
    config::Mode,
    serve::control::{call, Request},
};

use super::{print_json, SocketArg};

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    socket: SocketArg,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn execute(args: StatusArgs) -> anyhow::Result<()> {
    let s = call(&args.socket.socket, &Request::Status)?;
    if args.json {
        return print_json(&s);
    }
    println!(
        "limiter pid {} up {} s; config {}; pin_dir {}",
        s["pid"],
        s["uptime_seconds"],
        s["config"].as_str().unwrap_or("?"),
        s["pin_dir"].as_str().unwrap_or("?")
    );
    println!(
        "rules: {} (generation {}, {} runtime quota overrides)",
        s["rules"], s["generation"], s["overrides"]
    );
    if s["bypass"] == true {
        println!(
            "bypass: ON: every frame passes unclassified, unmetered and uncounted \
             (CONTROL flags bit 0; clear it to enforce again)"
        );
    } else {
        println!("bypass: off");
    }
    if let Some(allocator) = s["allocator"].as_str() {
        println!("fleet: reporting to {allocator}");
    }
    for r in s["shares"].as_array().into_iter().flatten() {
        println!("{}", rule_line(r));
    }
    for i in s["interfaces"].as_array().into_iter().flatten() {
        let mode = i["mode"].as_str().unwrap_or("?");
        println!(
            "interface {}: {}, program {}, {} {} ({}), program id {}",
            i["name"].as_str().unwrap_or("?"),
            if mode == AttachedMode::Tc.as_str() {
                "TC ingress".to_string()
            } else {
                format!("{mode} XDP")
            },
            i["program"].as_str().unwrap_or("?"),
            i["hook"].as_str().unwrap_or("link"),
            i["link"].as_str().unwrap_or("?"),
            match i["pin"].as_str() {
                Some(pin) => format!("pinned at {pin}"),
                None => "on the interface, nothing pinned".to_string(),
            },
            i["program_id"]
        );
        if let Some(problem) = i["problem"].as_str() {
            let until = if i["attached"] == false {
                "until the daemon attaches to it again"
            } else {
                "until the daemon restarts"
            };
            println!("  NOT RUNNING: {problem}; frames pass unmetered {until}");
        }
        if i["reattaches"].as_u64().unwrap_or(0) > 0
            || i["reattach_failures"].as_u64().unwrap_or(0) > 0
        {
            println!(
                "  attached again {} times to the interface created again under this name ({} attempts failed)",
                i["reattaches"], i["reattach_failures"]
            );
        }
        let chain = i["chain"].as_array().into_iter().flatten();
        for (n, e) in chain.enumerate() {
            println!(
                "  {}. {} (id {}){}: {}",
                n + 1,
                e["name"].as_str().unwrap_or("?"),
                e["program_id"],
                if e["limiter"] == true {
                    " <- the limiter"
                } else {
                    ""
                },
                e["how"].as_str().unwrap_or("?")
            );
        }
        if !i["handoff"].is_null() {
            println!("  {}", handoff_line(&i["handoff"]));
        }
    }
    if !s["joined"].is_null() {
        println!(
            "joined the LB's root array: its root program calls the limiter; {}",
            handoff_line(&s["joined"])
        );
    }
    for iface in s["detached_unconfigured"].as_array().into_iter().flatten() {
        println!(
            "interface {}: no longer configured; detached at start (its link pin removed)",
            iface.as_str().unwrap_or("?")
        );
    }
    Ok(())
}

/// One rule of `shares`: its share state and rate in force, then its mode; a canary
/// says for which share of its sources it drops, so that an operator rolling one out
/// sees it where they look first.
fn rule_line(r: &serde_json::Value) -> String {
    let spelled = r["mode"].as_str().unwrap_or("?");
    let mode = match spelled.parse::<Mode>() {
        Ok(Mode::Shadow) => "shadow (would-drop only)".to_string(),
        Ok(Mode::Enforce) if r["enforce_percent"].as_f64().is_some_and(|p| p < 100.0) => {
            let percent = &r["enforce_percent"];
            format!(
                "canary {percent} % (enforced for {percent} % of sources, would-drop for the \
                 rest)"
            )
        }
        _ => spelled.to_string(),
    };
    format!(
        "rule {}: {} (rate {}, burst {}), {mode}",
        r["rule"].as_str().unwrap_or("?"),
        r["state"].as_str().unwrap_or("?"),
        r["rate"],
        r["burst"]
    )
}

/// How frames the limiter passes are handed over, in one line.
fn handoff_line(h: &serde_json::Value) -> String {
    let slots = match h["slots"].as_u64().unwrap_or(0) {
        0 => "no slot".to_string(),
        1 => format!("slot {}", h["first_slot"]),
        n => format!(
            "slots {}..{}",
            h["first_slot"],
            h["first_slot"].as_u64().unwrap_or(0) + n - 1
        ),
    };
    let to = match (h["program_id"].as_u64(), h["missing"].as_str()) {
        (Some(id), _) => format!(
            "to program {id} ({})",
            h["program_name"].as_str().unwrap_or("?")
        ),
        (None, Some(why)) => format!("MISSING: {why}"),
        (None, None) => "MISSING".to_string(),
    };
    let warning = h["warning"]
        .as_str()
        .map(|w| format!("; WARNING: {w}"))
        .unwrap_or_default();
    format!(
        "handoff ({}): tail call through {} {slots}, {to}; frames passed because the next \
         program was missing: {}{warning}",
        h["config"].as_str().unwrap_or("?"),
        h["array"].as_str().unwrap_or("?"),
        h["missing_frames"]
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use limiter_user::{config::Percent, daemon::ShareStatus};

    use super::rule_line;

    /// The line as the daemon's answer makes it: serialised, then read back as JSON.
    fn line_of(mode: &'static str, enforce_percent: Percent) -> String {
        let share = ShareStatus {
            rule: "web".into(),
            mode,
            enforce_percent,
            state: "standalone",
            rate: Some(100),
            burst: Some(10),
        };
        rule_line(&serde_json::to_value(&share).unwrap())
    }

    #[test]
    fn a_rule_line_says_the_mode_and_a_canary_its_share_of_sources() {
        assert_eq!(
            line_of("enforce", Percent::ALL),
            "rule web: standalone (rate 100, burst 10), enforce"
        );
        assert_eq!(
            line_of("shadow", Percent(0)),
            "rule web: standalone (rate 100, burst 10), shadow (would-drop only)"
        );
        assert_eq!(
            line_of("enforce", Percent(5_000)),
            "rule web: standalone (rate 100, burst 10), canary 5 % (enforced for 5 % of \
             sources, would-drop for the rest)"
        );
        let fraction = line_of("enforce", Percent(2_500));
        assert!(
            fraction.contains(", canary 2.5 % (enforced for 2.5 %"),
            "{fraction}"
        );
        // 0 % in enforce mode is still a canary: it drops for no source.
        let none = line_of("enforce", Percent(0));
        assert!(none.contains(", canary 0 % "), "{none}");
    }
}
