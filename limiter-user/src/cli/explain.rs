use std::net::{IpAddr, SocketAddr};

use anyhow::{bail, Context as _};
use limiter_user::{
    config::Proto,
    observe::explain::{render, ExplainQuery, Explanation},
    serve::control::{call, Request},
};

use super::{print_json, SocketArg};

#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// Source address of the frame.
    #[arg(long)]
    src: IpAddr,
    /// Destination: IP, IP:PORT, or [IPv6]:PORT.
    #[arg(long)]
    dst: String,
    /// Protocol: tcp | udp | icmp | any (default: tcp with a port, else any).
    #[arg(long)]
    proto: Option<Proto>,
    /// Frame length in bytes, for bytes rules.
    #[arg(long, default_value_t = 64)]
    len: u32,
    /// The frame is a TCP SYN (a new connection), what `syn` rules meter.
    #[arg(long)]
    syn: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    socket: SocketArg,
}

fn parse_dst(dst: &str) -> anyhow::Result<(IpAddr, Option<u16>)> {
    if let Ok(sa) = dst.parse::<SocketAddr>() {
        return Ok((sa.ip(), Some(sa.port())));
    }
    let ip = dst
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .with_context(|| format!("--dst {dst:?}: expected IP, IP:PORT or [IPv6]:PORT"))?;
    Ok((ip, None))
}

pub fn execute(args: ExplainArgs) -> anyhow::Result<()> {
    let (dst, dst_port) = parse_dst(&args.dst)?;
    if args.src.is_ipv4() != dst.is_ipv4() {
        bail!("--src and --dst must be the same address family");
    }
    let proto = args.proto.unwrap_or(if dst_port.is_some() {
        Proto::Tcp
    } else {
        Proto::Any
    });
    let query = ExplainQuery {
        src: args.src,
        dst,
        dst_port,
        proto,
        frame_len: args.len,
        syn: args.syn,
    };
    let value = call(&args.socket.socket, &Request::Explain(query))?;
    if args.json {
        return print_json(&value);
    }
    let e: Explanation = serde_json::from_value(value).context("decoding the explanation")?;
    print!("{}", render(&e));
    Ok(())
}
