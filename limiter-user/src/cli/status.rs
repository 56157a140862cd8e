use limiter_user::control::{call, Request};

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
        println!(
            "rule {}: {} (rate {}, burst {})",
            r["rule"].as_str().unwrap_or("?"),
            r["state"].as_str().unwrap_or("?"),
            r["rate"],
            r["burst"]
        );
    }
    for i in s["interfaces"].as_array().into_iter().flatten() {
        let mode = i["mode"].as_str().unwrap_or("?");
        println!(
            "interface {}: {}, program {}, {} {} ({}), program id {}",
            i["name"].as_str().unwrap_or("?"),
            if mode == "tc" {
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
