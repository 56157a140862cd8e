//! `bpftool -j` and `nft -j` as the tests and the bench read them: their JSON output
//! parsed with serde, never their text. Every error names the command line and shows what
//! the tool printed, so a failing test says which call went wrong and why.

use std::{
    io::Write as _,
    path::Path,
    process::{Command, Output, Stdio},
};

use anyhow::{bail, Context as _, Result};
use serde::{de::DeserializeOwned, Deserialize};
use serde_json::Value;

/// Runs `tool args`, `stdin` piped in; the output whatever the exit status. Fails only if
/// the tool cannot be run, naming the package that has it.
fn run(tool: &str, args: &[&str], stdin: Option<&str>) -> Result<Output> {
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running `{tool}` (`cargo xtask setup` installs it)"))?;
    {
        let mut pipe = child.stdin.take().context("no stdin")?;
        if let Some(text) = stdin {
            pipe.write_all(text.as_bytes())
                .with_context(|| format!("writing to `{tool} {}`", args.join(" ")))?;
        }
    }
    child
        .wait_with_output()
        .with_context(|| format!("waiting for `{tool} {}`", args.join(" ")))
}

/// What a tool printed, for an error message.
fn printed(out: &Output) -> String {
    format!(
        "{}; stdout: {}; stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )
}

/// Parses a tool's stdout as `T`.
fn parse<T: DeserializeOwned>(command: &str, out: &Output) -> Result<T> {
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "`{command}` printed no JSON of the expected shape: {}",
            printed(out)
        )
    })
}

/// `bpftool -j args`, its JSON output; fails if bpftool fails.
pub fn bpftool(args: &[&str]) -> Result<Value> {
    bpftool_as(args)
}

fn bpftool_as<T: DeserializeOwned>(args: &[&str]) -> Result<T> {
    let command = format!("bpftool -j {}", args.join(" "));
    let out = run("bpftool", &[&["-j"], args].concat(), None)?;
    if !out.status.success() {
        bail!("`{command}` failed: {}", printed(&out));
    }
    parse(&command, &out)
}

/// One map as `bpftool -j map show` reports it (the fields the tests read).
#[derive(Clone, Debug, Deserialize)]
pub struct MapShow {
    pub id: u32,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub name: String,
    pub max_entries: u64,
    /// The kernel's own accounting of the map's memory.
    pub bytes_memlock: u64,
}

/// `bpftool -j map show pinned PATH`.
pub fn bpftool_map_show_pinned(path: &Path) -> Result<MapShow> {
    let path = path.to_str().context("a pin path that is not UTF-8")?;
    bpftool_as(&["map", "show", "pinned", path])
}

/// `bpftool -j map show id ID`.
pub fn bpftool_map_show_id(id: u32) -> Result<MapShow> {
    bpftool_as(&["map", "show", "id", &id.to_string()])
}

/// `bpftool -j map dump pinned PATH`: one JSON object per entry (`key`, `value` as hex
/// bytes and, where the map has BTF, `formatted` with the field names).
pub fn bpftool_map_dump_pinned(path: &Path) -> Result<Vec<Value>> {
    let path = path.to_str().context("a pin path that is not UTF-8")?;
    bpftool_as(&["map", "dump", "pinned", path])
}

/// One BPF link as `bpftool -j link show` reports it.
#[derive(Clone, Debug, Deserialize)]
pub struct LinkShow {
    pub id: u32,
    /// The link type's name ("xdp", "tcx", …), or its number where this bpftool is older
    /// than the type (it prints `"type": 11` for a TCX link it cannot name).
    #[serde(rename = "type", deserialize_with = "name_or_number")]
    pub kind: String,
    pub prog_id: u32,
    /// The interface an XDP or TCX link is on.
    #[serde(default)]
    pub ifindex: Option<u32>,
}

impl LinkShow {
    /// Whether this is an XDP link (`BPF_LINK_TYPE_XDP` = 6, by name or number).
    pub fn is_xdp(&self) -> bool {
        self.kind == "xdp" || self.kind == "6"
    }
}

/// A JSON string as it is, a number as its decimal digits.
fn name_or_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    match Value::deserialize(d)? {
        Value::String(name) => Ok(name),
        Value::Number(n) => Ok(n.to_string()),
        other => Err(serde::de::Error::custom(format!(
            "a link type that is neither a name nor a number: {other}"
        ))),
    }
}

/// `bpftool -j link show`: every BPF link on the machine.
pub fn bpftool_links() -> Result<Vec<LinkShow>> {
    bpftool_as(&["link", "show"])
}

/// Whether program `id` is loaded (`bpftool -j prog show id ID`). Only "no such
/// program" counts as not loaded; any other failure is an error.
pub fn bpftool_prog_loaded(id: u32) -> Result<bool> {
    let args = ["-j", "prog", "show", "id", &id.to_string()];
    let command = format!("bpftool {}", args.join(" "));
    let out = run("bpftool", &args, None)?;
    if out.status.success() {
        let prog: Value = parse(&command, &out)?;
        return Ok(prog["id"] == id);
    }
    // On failure bpftool -j prints {"error": "..."} on stdout.
    let error: Value = parse(&command, &out)?;
    match error["error"].as_str() {
        Some(e) if e.contains("No such file or directory") => Ok(false),
        _ => bail!("`{command}` failed: {}", printed(&out)),
    }
}

/// `nft -j args` (with `stdin` piped in), its JSON output; fails if nft fails.
pub fn nft_json(args: &[&str], stdin: Option<&str>) -> Result<Value> {
    let command = format!("nft -j {}", args.join(" "));
    let out = run("nft", &[&["-j"], args].concat(), stdin)?;
    if !out.status.success() {
        bail!("`{command}` failed: {}", printed(&out));
    }
    parse(&command, &out)
}

/// `nft args` (with `stdin` piped in) for a command that prints nothing to read (`-f`,
/// `delete`); fails with what it printed.
pub fn nft(args: &[&str], stdin: Option<&str>) -> Result<()> {
    let out = run("nft", args, stdin)?;
    if !out.status.success() {
        bail!("`nft {}` failed: {}", args.join(" "), printed(&out));
    }
    Ok(())
}

/// The packet count of the `counter` in the rule commented `comment` of table
/// `family name`, from `nft -j list table`.
pub fn nft_rule_packets(family: &str, table: &str, comment: &str) -> Result<u64> {
    let listing = nft_json(&["list", "table", family, table], None)?;
    rule_packets(&listing, comment).with_context(|| {
        format!("`nft -j list table {family} {table}`: no counted rule commented {comment:?} in {listing}")
    })
}

/// The counter of the rule commented `comment` in an `nft -j` listing:
/// `{"nftables": [..., {"rule": {"comment": C, "expr": [..., {"counter": {"packets": N}}]}}]}`.
fn rule_packets(listing: &Value, comment: &str) -> Option<u64> {
    listing["nftables"]
        .as_array()?
        .iter()
        .filter_map(|item| item.get("rule"))
        .filter(|rule| rule["comment"] == comment)
        .find_map(|rule| {
            rule["expr"]
                .as_array()?
                .iter()
                .find_map(|e| e.get("counter")?.get("packets")?.as_u64())
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "tests")]
mod tests {
    use super::*;

    /// A listing as nft 1.0.6 prints it for the bench's table, trimmed.
    #[test]
    fn the_counter_of_the_commented_rule() {
        let listing: Value = serde_json::from_str(
            r#"{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
             {"table": {"family": "netdev", "name": "t", "handle": 1}},
             {"rule": {"family": "netdev", "table": "t", "chain": "ingress", "handle": 2,
               "expr": [{"counter": {"packets": 7, "bytes": 9}}]}},
             {"rule": {"family": "netdev", "table": "t", "chain": "ingress", "handle": 3,
               "comment": "over",
               "expr": [{"match": {"op": "==", "left": {"payload": {"protocol": "ip",
                 "field": "daddr"}}, "right": "198.18.0.2"}},
                 {"counter": {"packets": 42, "bytes": 2520}}, {"drop": null}]}}]}"#,
        )
        .unwrap();
        assert_eq!(rule_packets(&listing, "over"), Some(42));
        assert_eq!(rule_packets(&listing, "under"), None);
        assert_eq!(rule_packets(&serde_json::json!({}), "over"), None);
    }

    /// bpftool names the link types it knows and numbers the others.
    #[test]
    fn link_types_by_name_or_number() {
        let links: Vec<LinkShow> = serde_json::from_str(
            r#"[{"id": 1, "type": "xdp", "prog_id": 7, "ifindex": 3},
                {"id": 2, "type": 11, "prog_id": 8}, {"id": 3, "type": 6, "prog_id": 9}]"#,
        )
        .unwrap();
        let xdp: Vec<u32> = links.iter().filter(|l| l.is_xdp()).map(|l| l.id).collect();
        assert_eq!(xdp, [1, 3]);
        assert_eq!(links[1].kind, "11");
        assert!(serde_json::from_str::<Vec<LinkShow>>(
            r#"[{"id": 1, "type": null, "prog_id": 1}]"#
        )
        .is_err());
    }
}
