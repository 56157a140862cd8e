//! Typed access to the program's maps, from a loaded object or from pins. Installing a
//! rule table writes the idle generation, then flips `CONTROL.generation`.

use std::{
    collections::{BTreeMap, BTreeSet},
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
};

use aya::{
    maps::{
        lpm_trie::Key, Array, HashMap, LpmTrie, Map, MapData, MapError, PerCpuArray, PerCpuValues,
    },
    util::nr_cpus,
    Ebpf,
};
use limiter_common::{
    abi::{
        map_name, rule_index, AggBucket, Bucket, Control, FragmentKey, FragmentRecord,
        GlobalCounters, Handoff, HandoffCounters, HeaderCounters, HostEntry, PrefixRules,
        RuleConfig, RuleCounters, RuleCpuState, SourceKey, SynCounters, TunnelConfig,
        TunnelCounters, AGG_BUCKET_CREDIT_OFFSET, AGG_BUCKET_TAT_OFFSET, CONTROL_BYPASS,
        CONTROL_TUNNELS, HOST_SLOTS, MAX_RULES, RULE_HAS_PER_SOURCE, RULE_IN_USE,
    },
    drop::{MonitorConfig, MonitorCounters, ReasonCounters},
    gcra::Limit,
    maps::map_spec,
    sketch::{self, SketchCounters, SketchMeta},
};

use crate::{
    error::Error,
    policy::{
        ruleset::{HostTable, PrefixEntry, RuleTable},
        sketch_regions::{self, SourceRule},
    },
};

type Trie<const N: usize> = LpmTrie<MapData, [u8; N], PrefixRules>;

/// The maps the daemon reads and writes.
pub struct Maps {
    control: Array<MapData, Control>,
    rules: Array<MapData, RuleConfig>,
    v4: [Trie<4>; 2],
    v6: [Trie<16>; 2],
    agg_buckets: Array<MapData, AggBucket>,
    /// AGG_BUCKETS's words through a shared mapping, made at first use.
    agg_words: SharedWords,
    /// Per-source GCRA cells (limiter_common::sketch) and how to find a source's.
    src_sketch: Array<MapData, Bucket>,
    /// Its descriptor, for clearing a region through a shared mapping.
    src_sketch_fd: OwnedFd,
    /// Its cells through a shared mapping kept for sampling (crate::policy::saturation), made at
    /// first use.
    src_sketch_words: SharedWords,
    /// An earlier version's per-source LRU found pinned, carried into the sketch by the
    /// first install (which knows the rules' regions), then unpinned.
    earlier_lru: Option<(PathBuf, HashMap<MapData, SourceKey, Bucket>)>,
    sketch_meta: Array<MapData, SketchMeta>,
    sketch_counts: PerCpuArray<MapData, SketchCounters>,
    rule_counters: PerCpuArray<MapData, RuleCpuState>,
    global_counters: PerCpuArray<MapData, GlobalCounters>,
    /// `None` for pins of a build that predates the map (read as zeros).
    header_counters: Option<PerCpuArray<MapData, HeaderCounters>>,
    fragments: Option<HashMap<MapData, FragmentKey, FragmentRecord>>,
    hosts: Array<MapData, HostEntry>,
    /// SYNs each syn rule metered, per CPU (the fleet's demand in SYNs).
    rule_syns: PerCpuArray<MapData, SynCounters>,
    /// `None` for pins of a build that predates the handoff (no handoff, nothing missed).
    handoff: Option<Array<MapData, Handoff>>,
    handoff_counters: Option<PerCpuArray<MapData, HandoffCounters>>,
    /// `None` for pins of a build that predates tunnels (none decapsulated).
    tunnels: Option<HashMap<MapData, u32, TunnelConfig>>,
    tunnel_counters: Option<PerCpuArray<MapData, TunnelCounters>>,
    /// Absent only in maps pinned by a version before drop reasons.
    drop_reasons: Option<PerCpuArray<MapData, ReasonCounters>>,
    monitor: Option<Array<MapData, MonitorConfig>>,
    monitor_counts: Option<PerCpuArray<MapData, MonitorCounters>>,
    /// The sampled drop events, for whoever reads them ([`Maps::take_drop_events`]).
    drop_events: Option<aya::maps::RingBuf<MapData>>,
    /// Per generation, the `HOSTS` slots that may hold an entry; `None` until this
    /// process has written the generation (pins adopted from an earlier daemon).
    hosts_used: [Option<BTreeSet<u32>>; 2],
}

/// Per-source rules as the region plan sees them.
fn plan_view(rules: &BTreeMap<u32, RuleConfig>) -> BTreeMap<u32, SourceRule<'_>> {
    rules
        .iter()
        .map(|(slot, r)| {
            (
                *slot,
                SourceRule {
                    name: r.name_bytes(),
                    limit: r.per_source,
                    region: r.sketch_region,
                },
            )
        })
        .collect()
}

/// The per-source rules of the live table and of `table`, by slot.
fn per_source_rules(
    live: &BTreeMap<u32, RuleConfig>,
    table: &RuleTable,
) -> (BTreeMap<u32, RuleConfig>, BTreeMap<u32, RuleConfig>) {
    let per_source =
        |r: &RuleConfig| r.flags & RULE_IN_USE != 0 && r.flags & RULE_HAS_PER_SOURCE != 0;
    let before = live
        .iter()
        .filter(|(_, r)| per_source(r))
        .map(|(s, r)| (*s, *r))
        .collect();
    let after = table
        .rules
        .iter()
        .filter(|(_, r)| per_source(r))
        .copied()
        .collect();
    (before, after)
}

/// The sketch's region plan installing `table` over the `live` rules would follow
/// ([`Maps::install`]), and how many per-source rules run now: what a reload's
/// dry run reports.
pub fn region_plan(
    live: &BTreeMap<u32, RuleConfig>,
    table: &RuleTable,
) -> (sketch_regions::RegionPlan, usize) {
    let (before, after) = per_source_rules(live, table);
    (
        sketch_regions::plan(&plan_view(&before), &plan_view(&after)),
        before.len(),
    )
}

fn map_err(what: impl Into<String>) -> impl FnOnce(MapError) -> Error {
    let what = what.into();
    move |source| Error::Map { what, source }
}

fn typed<T>(map: Map, name: &'static str) -> Result<T, Error>
where
    T: TryFrom<Map, Error = MapError>,
{
    T::try_from(map).map_err(map_err(format!("opening map {name}")))
}

/// A map the first pinned layout lacked (the table's `in_first_layout`): `None` where an
/// older daemon's pins do not have it. One the first layout had is required.
fn added_later<T>(
    take: &mut impl FnMut(&'static str) -> Result<Map, Error>,
    name: &'static str,
) -> Result<Option<T>, Error>
where
    T: TryFrom<Map, Error = MapError>,
{
    match take(name) {
        Ok(map) => typed(map, name).map(Some),
        Err(_) if !map_spec(name).in_first_layout => Ok(None),
        Err(e) => Err(e),
    }
}

impl Maps {
    /// Takes the maps out of a loaded object.
    /// Sets up the per-source sketch if the maps are new.
    pub fn from_ebpf(ebpf: &mut Ebpf) -> Result<Maps, Error> {
        let mut maps = Self::build(|name| ebpf.take_map(name).ok_or(Error::MissingMap(name)))?;
        maps.sketch_meta()?;
        Ok(maps)
    }

    /// Opens the maps pinned under `pin_dir` by a running (or previous) daemon.
    pub fn from_pins(pin_dir: &Path) -> Result<Maps, Error> {
        // A directory the caller may not search reads as "nothing pinned" to exists():
        // say it is root's instead.
        if let Err(e) = std::fs::metadata(pin_dir.join(map_name::CONTROL)) {
            if e.kind() == std::io::ErrorKind::PermissionDenied {
                return Err(Error::Permission(
                    crate::host::privilege::PermissionError::NotRoot {
                        doing: "reading the pinned maps".to_string(),
                        path: pin_dir.to_path_buf(),
                    },
                ));
            }
        }
        if !pin_dir.join(map_name::CONTROL).exists() {
            return Err(Error::NotPinned(pin_dir.to_path_buf()));
        }
        Self::build(|name| {
            let path = pin_dir.join(name);
            let data = MapData::from_pin(&path)
                .map_err(map_err(format!("opening pinned map {}", path.display())))?;
            Map::from_map_data(data).map_err(map_err(format!("opening {}", path.display())))
        })
    }

    fn build(mut take: impl FnMut(&'static str) -> Result<Map, Error>) -> Result<Maps, Error> {
        let src_sketch_map = take(map_name::SRC_SKETCH)?;
        let src_sketch_fd = array_fd(&src_sketch_map, map_name::SRC_SKETCH)?;
        let src_sketch_words = SharedWords::new(array_fd(&src_sketch_map, map_name::SRC_SKETCH)?);
        let src_sketch = typed(src_sketch_map, map_name::SRC_SKETCH)?;
        let agg_map = take(map_name::AGG_BUCKETS)?;
        let agg_words = SharedWords::new(array_fd(&agg_map, map_name::AGG_BUCKETS)?);
        let sketch_meta = typed(take(map_name::SKETCH_META)?, map_name::SKETCH_META)?;
        let sketch_counts = typed(take(map_name::SKETCH_COUNTS)?, map_name::SKETCH_COUNTS)?;
        Ok(Maps {
            control: typed(take(map_name::CONTROL)?, map_name::CONTROL)?,
            rules: typed(take(map_name::RULES)?, map_name::RULES)?,
            v4: [
                typed(take(map_name::PREFIXES_V4_0)?, map_name::PREFIXES_V4_0)?,
                typed(take(map_name::PREFIXES_V4_1)?, map_name::PREFIXES_V4_1)?,
            ],
            v6: [
                typed(take(map_name::PREFIXES_V6_0)?, map_name::PREFIXES_V6_0)?,
                typed(take(map_name::PREFIXES_V6_1)?, map_name::PREFIXES_V6_1)?,
            ],
            agg_buckets: typed(agg_map, map_name::AGG_BUCKETS)?,
            agg_words,
            src_sketch,
            src_sketch_fd,
            src_sketch_words,
            earlier_lru: None,
            sketch_meta,
            sketch_counts,
            rule_counters: typed(take(map_name::RULE_COUNTERS)?, map_name::RULE_COUNTERS)?,
            global_counters: typed(take(map_name::GLOBAL_COUNTERS)?, map_name::GLOBAL_COUNTERS)?,
            header_counters: added_later(&mut take, map_name::HEADER_COUNTERS)?,
            fragments: added_later(&mut take, map_name::FRAGMENTS)?,
            hosts: typed(take(map_name::HOSTS)?, map_name::HOSTS)?,
            rule_syns: typed(take(map_name::RULE_SYNS)?, map_name::RULE_SYNS)?,
            handoff: added_later(&mut take, map_name::HANDOFF)?,
            handoff_counters: added_later(&mut take, map_name::HANDOFF_COUNTS)?,
            tunnels: added_later(&mut take, map_name::TUNNELS)?,
            tunnel_counters: added_later(&mut take, map_name::TUNNEL_COUNTS)?,
            drop_reasons: added_later(&mut take, map_name::DROP_REASONS)?,
            monitor: added_later(&mut take, map_name::MONITOR)?,
            monitor_counts: added_later(&mut take, map_name::MONITOR_COUNTS)?,
            drop_events: added_later(&mut take, map_name::DROP_EVENTS)?,
            hosts_used: [None, None],
        })
    }

    pub fn control(&self) -> Result<Control, Error> {
        self.control.get(&0, 0).map_err(map_err("reading CONTROL"))
    }

    pub fn set_control(&mut self, control: Control) -> Result<(), Error> {
        self.control
            .set(0, control, 0)
            .map_err(map_err("writing CONTROL"))
    }

    /// Sets or clears the `CONTROL` bypass bit, keeping the generation; returns whether
    /// it changed.
    pub fn set_bypass(&mut self, on: bool) -> Result<bool, Error> {
        let control = self.control()?;
        let flags = if on {
            control.flags | CONTROL_BYPASS
        } else {
            control.flags & !CONTROL_BYPASS
        };
        if flags == control.flags {
            return Ok(false);
        }
        self.set_control(Control { flags, ..control })?;
        Ok(true)
    }

    /// The rules of the live generation, by slot.
    pub fn live_rules(&self) -> Result<BTreeMap<u32, RuleConfig>, Error> {
        let generation = self.control()?.generation;
        let mut out = BTreeMap::new();
        for slot in 0..MAX_RULES {
            let rule = self
                .rules
                .get(&rule_index(generation, slot), 0)
                .map_err(map_err(format!("reading RULES slot {slot}")))?;
            if rule.flags & RULE_IN_USE != 0 {
                out.insert(slot, rule);
            }
        }
        Ok(out)
    }

    /// The live generation's record of `slot` (what the program reads for it now).
    pub fn live_rule(&self, slot: u32) -> Result<RuleConfig, Error> {
        let generation = self.control()?.generation;
        self.rules
            .get(&rule_index(generation, slot), 0)
            .map_err(map_err(format!("reading RULES slot {slot}")))
    }

    /// Name -> slot of the live rules (for keeping slots stable across restarts).
    pub fn live_slots(&self) -> Result<BTreeMap<String, u32>, Error> {
        Ok(self
            .live_rules()?
            .into_iter()
            .map(|(slot, rule)| {
                (
                    String::from_utf8_lossy(rule.name_bytes()).into_owned(),
                    slot,
                )
            })
            .collect())
    }

    /// Installs `table` atomically: fills the idle generation, then flips to it. Slots
    /// that change hands (a rule new to the slot) start with a full bucket and zeroed
    /// counters; every other rule keeps its bucket and counters.
    ///
    /// The previous generation stays readable until the next install; packets that read
    /// the generation word just before the flip finish on it (an XDP run takes
    /// microseconds; installs are operator- or allocator-paced).
    pub fn install(&mut self, table: &RuleTable) -> Result<(), Error> {
        let control = self.control()?;
        let live = self.live_rules()?;
        let next = (control.generation ^ 1) & 1;

        // A slot new to its rule starts with a full aggregate bucket and zero counters.
        // Only a slot no live rule holds is cleared: the live table's frames would meet
        // the fresh bucket, and count as the new rule's (`daemon::install_rules` brings
        // a rule that takes over a live slot in after a grace period).
        for (slot, rule) in &table.rules {
            match live.get(slot) {
                Some(old) if old.name_bytes() == rule.name_bytes() => {}
                Some(old) if old.flags & RULE_IN_USE != 0 => {
                    return Err(Error::SlotInUse {
                        slot: *slot,
                        live: String::from_utf8_lossy(old.name_bytes()).into_owned(),
                        new: String::from_utf8_lossy(rule.name_bytes()).into_owned(),
                    })
                }
                _ => self.reset_slot(*slot)?,
            }
        }
        let regions = self.place_sources(&live, table)?;

        replace_trie(&mut self.v4[next as usize], &table.v4, "IPv4")?;
        replace_trie(&mut self.v6[next as usize], &table.v6, "IPv6")?;
        self.replace_hosts(next, &HostTable::build(table))?;
        for slot in 0..MAX_RULES {
            let mut rule = table.rule(slot).copied().unwrap_or(RuleConfig::EMPTY);
            rule.sketch_region = regions.get(&slot).copied().unwrap_or(sketch::WHOLE_ROW);
            self.rules
                .set(rule_index(next, slot), rule, 0)
                .map_err(map_err(format!("writing RULES slot {slot}")))?;
        }
        self.set_control(Control {
            generation: next,
            ..control
        })?;
        Ok(())
    }

    /// Gives each per-source rule of `table` its region of the sketch
    /// (crate::policy::sketch_regions), clears the regions that change hands, and carries an
    /// earlier version's LRU state into the regions of the rules it was kept for. Runs
    /// before the table goes live, so no frame of a new owner meets an old owner's state.
    fn place_sources(
        &mut self,
        live: &BTreeMap<u32, RuleConfig>,
        table: &RuleTable,
    ) -> Result<BTreeMap<u32, u32>, Error> {
        let (before, after) = per_source_rules(live, table);
        let plan = sketch_regions::plan(&plan_view(&before), &plan_view(&after));
        for region in &plan.cleared {
            self.clear_region(*region)?;
        }
        if let Some((path, lru)) = self.earlier_lru.take() {
            // Kept for the rules of the table the buckets were keyed by (same slot, same
            // name); a rule new to its slot starts fresh anyway.
            let kept: BTreeMap<u32, (Limit, u32)> = after
                .iter()
                .filter(|(s, r)| {
                    before
                        .get(s)
                        .is_some_and(|b| b.name_bytes() == r.name_bytes())
                })
                .filter_map(|(s, r)| {
                    plan.regions
                        .get(s)
                        .map(|region| (*s, (r.per_source, *region)))
                })
                .collect();
            match self.fold_lru(&lru, &kept) {
                Ok(carried) => tracing::info!(
                    carried,
                    "per-source state of the earlier version's SRC_BUCKETS carried into the \
                     sketch; its pin removed"
                ),
                Err(e) => tracing::warn!(
                    "per-source state of the earlier version not carried over (every source \
                     starts with its burst): {e}"
                ),
            }
            drop(lru);
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!("removing {}: {e}", path.display());
            }
        }
        Ok(plan.regions)
    }

    /// Zeroes every cell of `region` in each row, through a shared mapping of the array
    /// (one memset instead of a syscall a cell; millions of cells at 16 M sources).
    fn clear_region(&mut self, region: u32) -> Result<(), Error> {
        let cells = self.src_sketch.len() as usize;
        let width = cells / sketch::ROWS as usize;
        if width == 0 {
            return Ok(());
        }
        let (base, mask) = sketch::region_span(region, (width - 1) as u32);
        let mapping = Mapping::new(&self.src_sketch_fd, cells).map_err(|source| Error::Io {
            what: "mapping SRC_SKETCH to clear a rule's region".into(),
            source,
        })?;
        let tats = mapping.words();
        for row in 0..sketch::ROWS as usize {
            let start = row * width + base as usize;
            for tat in &tats[start..=start + mask as usize] {
                tat.store(0, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// Writes generation `generation` of `HOSTS`: the slots `hosts` uses, and the ones
    /// the generation used before (every slot the first time, when that is unknown).
    fn replace_hosts(&mut self, generation: u32, hosts: &HostTable) -> Result<(), Error> {
        let used: BTreeSet<u32> = (0..HOST_SLOTS)
            .filter(|&i| hosts.slots[i as usize].family != 0)
            .collect();
        let stale: Vec<u32> = match &self.hosts_used[generation as usize] {
            Some(before) => before.union(&used).copied().collect(),
            None => (0..HOST_SLOTS).collect(),
        };
        // Forget the old set first: if a write fails half way, the next install rewrites
        // the whole generation.
        self.hosts_used[generation as usize] = None;
        for i in stale {
            self.hosts
                .set(generation * HOST_SLOTS + i, hosts.slots[i as usize], 0)
                .map_err(map_err(format!("writing HOSTS slot {i}")))?;
        }
        self.hosts_used[generation as usize] = Some(used);
        if hosts.unplaced > 0 {
            tracing::warn!(
                unplaced = hosts.unplaced,
                "host prefixes without a slot in the exact-address table; the prefix trie \
                 matches them (slower path)"
            );
        }
        Ok(())
    }

    fn reset_slot(&mut self, slot: u32) -> Result<(), Error> {
        self.agg_buckets
            .set(slot, AggBucket::default(), 0)
            .map_err(map_err(format!("resetting AGG_BUCKETS slot {slot}")))?;
        let cpus = nr_cpus().map_err(|(_, e)| Error::Io {
            what: "counting possible CPUs".into(),
            source: e,
        })?;
        let zeros =
            PerCpuValues::try_from(vec![RuleCpuState::default(); cpus]).map_err(|e| Error::Io {
                what: "building per-CPU zeros".into(),
                source: e,
            })?;
        self.rule_counters
            .set(slot, zeros, 0)
            .map_err(map_err(format!("resetting RULE_COUNTERS slot {slot}")))?;
        let zeros =
            PerCpuValues::try_from(vec![SynCounters::default(); cpus]).map_err(|e| Error::Io {
                what: "building per-CPU zeros".into(),
                source: e,
            })?;
        self.rule_syns
            .set(slot, zeros, 0)
            .map_err(map_err(format!("resetting RULE_SYNS slot {slot}")))?;
        // The reasons too: a rule that takes a slot over must not be born with the removed
        // rule's refusals in its `reasons` and in `limiter_rule_dropped_packets_total`.
        let Some(map) = self.drop_reasons.as_mut() else {
            return Ok(());
        };
        let zeros = PerCpuValues::try_from(vec![ReasonCounters::default(); cpus]).map_err(|e| {
            Error::Io {
                what: "building per-CPU zeros".into(),
                source: e,
            }
        })?;
        map.set(slot, zeros, 0)
            .map_err(map_err(format!("resetting DROP_REASONS slot {slot}")))
    }

    /// SYNs a syn rule metered, summed over CPUs (wrapping, as the kernel's adds wrap).
    pub fn rule_syns(&self, slot: u32) -> Result<u64, Error> {
        let per_cpu = self
            .rule_syns
            .get(&slot, 0)
            .map_err(map_err(format!("reading RULE_SYNS slot {slot}")))?;
        Ok(per_cpu
            .iter()
            .fold(0u64, |sum, c| sum.wrapping_add(c.offered)))
    }

    /// A rule's counters summed over CPUs.
    pub fn rule_counters(&self, slot: u32) -> Result<RuleCounters, Error> {
        let per_cpu = self
            .rule_counters
            .get(&slot, 0)
            .map_err(map_err(format!("reading RULE_COUNTERS slot {slot}")))?;
        let mut total = RuleCounters::default();
        for c in per_cpu.iter() {
            total.accumulate(&c.counters);
        }
        Ok(total)
    }

    /// A rule's counters, one entry per possible CPU (e.g. to see which CPUs ran it).
    pub fn rule_counters_per_cpu(&self, slot: u32) -> Result<Vec<RuleCounters>, Error> {
        let per_cpu = self
            .rule_counters
            .get(&slot, 0)
            .map_err(map_err(format!("reading RULE_COUNTERS slot {slot}")))?;
        Ok(per_cpu.iter().map(|c| c.counters).collect())
    }

    /// Program-wide counters summed over CPUs.
    pub fn global_counters(&self) -> Result<GlobalCounters, Error> {
        let per_cpu = self
            .global_counters
            .get(&0, 0)
            .map_err(map_err("reading GLOBAL_COUNTERS"))?;
        let mut total = GlobalCounters::default();
        for c in per_cpu.iter() {
            total.accumulate(c);
        }
        Ok(total)
    }

    /// Where passed frames go next (`slots == 0`: the stack).
    pub fn handoff(&self) -> Result<Handoff, Error> {
        match &self.handoff {
            Some(map) => map.get(&0, 0).map_err(map_err("reading HANDOFF")),
            None => Ok(Handoff::default()),
        }
    }

    pub fn set_handoff(&mut self, handoff: Handoff) -> Result<(), Error> {
        self.handoff
            .as_mut()
            .ok_or(Error::MissingMap(map_name::HANDOFF))?
            .set(0, handoff, 0)
            .map_err(map_err("writing HANDOFF"))
    }

    /// Frames passed because the next program was missing, summed over CPUs.
    pub fn handoff_counters(&self) -> Result<HandoffCounters, Error> {
        let mut total = HandoffCounters::default();
        let Some(map) = &self.handoff_counters else {
            return Ok(total);
        };
        let per_cpu = map.get(&0, 0).map_err(map_err("reading HANDOFF_COUNTS"))?;
        for c in per_cpu.iter() {
            total.accumulate(c);
        }
        Ok(total)
    }

    /// Makes `entries` (ifindex, what it decapsulates) the whole of `TUNNELS`, and sets
    /// `CONTROL_TUNNELS` when there is any. Entries are written before the flag is set
    /// and the flag cleared before they go: no frame looks for an entry that is not
    /// there yet, and a frame that finds none is classified by its outer header.
    pub fn set_tunnels(&mut self, entries: &BTreeMap<u32, TunnelConfig>) -> Result<(), Error> {
        let Some(map) = self.tunnels.as_mut() else {
            if entries.is_empty() {
                return Ok(());
            }
            return Err(Error::MissingMap(map_name::TUNNELS));
        };
        for (ifindex, config) in entries {
            map.insert(ifindex, config, 0)
                .map_err(map_err(format!("writing TUNNELS[{ifindex}]")))?;
        }
        let mut control = self.control()?;
        let flags = if entries.is_empty() {
            control.flags & !CONTROL_TUNNELS
        } else {
            control.flags | CONTROL_TUNNELS
        };
        if flags != control.flags {
            control.flags = flags;
            self.set_control(control)?;
        }
        let Some(map) = self.tunnels.as_mut() else {
            return Ok(());
        };
        let stale: Vec<u32> = map
            .keys()
            .filter_map(Result::ok)
            .filter(|k| !entries.contains_key(k))
            .collect();
        for ifindex in stale {
            map.remove(&ifindex)
                .map_err(map_err(format!("removing TUNNELS[{ifindex}]")))?;
        }
        Ok(())
    }

    /// Tunnelled frames, summed over CPUs.
    pub fn tunnel_counters(&self) -> Result<TunnelCounters, Error> {
        let mut total = TunnelCounters::default();
        let Some(map) = &self.tunnel_counters else {
            return Ok(total);
        };
        let per_cpu = map.get(&0, 0).map_err(map_err("reading TUNNEL_COUNTS"))?;
        for c in per_cpu.iter() {
            total.accumulate(c);
        }
        Ok(total)
    }

    /// Refusals of rule `slot` (or of `limiter_common::drop::NO_RULE`) by reason, summed over CPUs; zero
    /// when the maps predate drop reasons.
    pub fn reason_counters(&self, slot: u32) -> Result<ReasonCounters, Error> {
        let mut total = ReasonCounters::default();
        let Some(map) = &self.drop_reasons else {
            return Ok(total);
        };
        let per_cpu = map
            .get(&slot, 0)
            .map_err(map_err(format!("reading DROP_REASONS entry {slot}")))?;
        for c in per_cpu.iter() {
            total.accumulate(c);
        }
        Ok(total)
    }

    /// The sampling budget the program reads (`MONITOR[0]`).
    pub fn monitor_config(&self) -> Result<MonitorConfig, Error> {
        match &self.monitor {
            Some(map) => map.get(&0, 0).map_err(map_err("reading MONITOR")),
            None => Ok(MonitorConfig::default()),
        }
    }

    /// Sets the sampling budget, live. Maps pinned by a version before sampling have no
    /// `MONITOR`: sampling on is refused there, off is a no-op.
    pub fn set_monitor_config(&mut self, config: MonitorConfig) -> Result<(), Error> {
        match &mut self.monitor {
            Some(map) => map.set(0, config, 0).map_err(map_err("writing MONITOR")),
            None if config.events_per_sec == 0 => Ok(()),
            None => Err(Error::MissingMap(map_name::MONITOR)),
        }
    }

    /// The `DROP_EVENTS` ring buffer, to read the sampled events (once: a ring buffer
    /// has one consumer position).
    pub fn take_drop_events(&mut self) -> Option<aya::maps::RingBuf<MapData>> {
        self.drop_events.take()
    }

    /// Sampling counters, summed over CPUs.
    pub fn monitor_counters(&self) -> Result<MonitorCounters, Error> {
        let mut total = MonitorCounters::default();
        let Some(map) = &self.monitor_counts else {
            return Ok(total);
        };
        let per_cpu = map.get(&0, 0).map_err(map_err("reading MONITOR_COUNTS"))?;
        for c in per_cpu.iter() {
            total.sampled = total.sampled.wrapping_add(c.sampled);
            total.skipped_budget = total.skipped_budget.wrapping_add(c.skipped_budget);
            total.lost_full = total.lost_full.wrapping_add(c.lost_full);
        }
        Ok(total)
    }

    /// Counters of fragments and refused header tricks, summed over CPUs.
    pub fn header_counters(&self) -> Result<HeaderCounters, Error> {
        let mut total = HeaderCounters::default();
        let Some(map) = &self.header_counters else {
            return Ok(total);
        };
        let per_cpu = map.get(&0, 0).map_err(map_err("reading HEADER_COUNTERS"))?;
        for c in per_cpu.iter() {
            total.accumulate(c);
        }
        Ok(total)
    }

    /// The record a datagram's first fragment left, if any.
    pub fn fragment_record(&self, key: &FragmentKey) -> Result<Option<FragmentRecord>, Error> {
        let Some(map) = &self.fragments else {
            return Ok(None);
        };
        match map.get(key, 0) {
            Ok(r) => Ok(Some(r)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(Error::Map {
                what: "reading FRAGMENTS".into(),
                source: e,
            }),
        }
    }

    /// Writes a datagram's record (tests: a record as old as a test needs).
    pub fn set_fragment_record(
        &mut self,
        key: &FragmentKey,
        record: &FragmentRecord,
    ) -> Result<(), Error> {
        let Some(map) = &mut self.fragments else {
            return Err(Error::MissingMap(map_name::FRAGMENTS));
        };
        map.insert(key, record, 0)
            .map_err(map_err("writing FRAGMENTS"))
    }

    /// The sketch's seed and width, setting them up first if the map is new (zeroed):
    /// a random seed, and the width the array was created for. Adopted pins keep theirs.
    pub fn sketch_meta(&mut self) -> Result<SketchMeta, Error> {
        let meta = self
            .sketch_meta
            .get(&0, 0)
            .map_err(map_err("reading SKETCH_META"))?;
        if meta.width_mask != 0 {
            return Ok(meta);
        }
        let cells = self.src_sketch.len();
        let width = cells / sketch::ROWS;
        if width == 0 || !width.is_power_of_two() || width * sketch::ROWS != cells {
            return Err(Error::Io {
                what: format!(
                    "SRC_SKETCH has {cells} cells, not {} rows of 2^n",
                    sketch::ROWS
                ),
                source: std::io::Error::from(std::io::ErrorKind::InvalidData),
            });
        }
        let meta = SketchMeta {
            seed: random_seed()?,
            width_mask: width - 1,
            rows: sketch::ROWS,
        };
        self.sketch_meta
            .set(0, meta, 0)
            .map_err(map_err("writing SKETCH_META"))?;
        Ok(meta)
    }

    /// The sketch's seed and width as they are (zero: not set up yet).
    pub fn sketch_meta_as_is(&self) -> Result<SketchMeta, Error> {
        self.sketch_meta
            .get(&0, 0)
            .map_err(map_err("reading SKETCH_META"))
    }

    /// A source's cells under `rule` (its per-source limit and region): (index, TAT) per
    /// row. `None` when the sketch is not set up.
    pub fn source_cells(
        &self,
        key: &SourceKey,
        rule: &RuleConfig,
    ) -> Result<Option<[(u32, u64); sketch::ROWS as usize]>, Error> {
        let meta = self.sketch_meta_as_is()?;
        if meta.width_mask == 0 {
            return Ok(None);
        }
        let mut out = [(0u32, 0u64); sketch::ROWS as usize];
        for (slot, index) in out.iter_mut().zip(sketch::cells_of(
            &meta,
            rule.sketch_region,
            key,
            &rule.per_source,
        )) {
            let bucket = self
                .src_sketch
                .get(&index, 0)
                .map_err(map_err(format!("reading SRC_SKETCH cell {index}")))?;
            *slot = (index, bucket.tat);
        }
        Ok(Some(out))
    }

    /// Sets one sketch cell (seeding state: tests, an upgrade carrying LRU state over).
    pub fn set_sketch_cell(&mut self, index: u32, tat: u64) -> Result<(), Error> {
        self.src_sketch
            .set(index, Bucket { tat }, 0)
            .map_err(map_err(format!("writing SRC_SKETCH cell {index}")))
    }

    /// Cells per row of the sketch (`max_sources` rounded up to a power of two).
    pub fn sketch_width(&self) -> u32 {
        self.src_sketch.len() / sketch::ROWS
    }

    /// How full the sketch is: of `SAMPLE_CELLS` cells spread evenly over it, how many
    /// hold state at `now` (ticks). Hashing spreads sources evenly, so this estimates
    /// the busy share of every cell to about ±1.5 % (4096 reads, one syscall each).
    pub fn sketch_busy(&self, now: u64) -> Result<SketchFill, Error> {
        const SAMPLE_CELLS: u32 = 4096;
        let cells = self.src_sketch.len();
        let step = (cells / SAMPLE_CELLS).max(1);
        let mut fill = SketchFill::default();
        let mut index = 0;
        while index < cells {
            let bucket = self
                .src_sketch
                .get(&index, 0)
                .map_err(map_err(format!("reading SRC_SKETCH cell {index}")))?;
            fill.sampled += 1;
            if !sketch::at_rest(bucket.tat, now) {
                fill.busy += 1;
            }
            index += step;
        }
        Ok(fill)
    }

    /// A sample of `rule`'s part of the sketch (its live region) at `now` (ticks): in each
    /// row, `per_row` cells spread over the part from `phase` on, and how many of them
    /// would refuse one more frame of the rule (crate::policy::saturation). Read through a shared
    /// mapping kept alive: no syscall a cell.
    pub fn saturation_sample(
        &self,
        rule: &RuleConfig,
        now: u64,
        per_row: u32,
        phase: u32,
    ) -> Result<crate::policy::saturation::Sample, Error> {
        let cells = self.src_sketch.len() as usize;
        let width = cells / sketch::ROWS as usize;
        if width == 0 {
            return Ok(crate::policy::saturation::Sample::default());
        }
        let tats = self
            .src_sketch_words
            .words(cells)
            .map_err(|source| Error::Io {
                what: "mapping SRC_SKETCH to sample a rule's cells".into(),
                source,
            })?;
        let (base, mask) = sketch::region_span(rule.sketch_region, (width - 1) as u32);
        let part = mask + 1;
        let mut rows: [Vec<u64>; sketch::ROWS as usize] = Default::default();
        for (row, out) in rows.iter_mut().enumerate() {
            let start = row * width + base as usize;
            *out = crate::policy::saturation::sample_offsets(part, per_row, phase)
                .filter_map(|o| tats.get(start + o as usize))
                .map(|tat| tat.load(Ordering::Relaxed))
                .collect();
        }
        Ok(crate::policy::saturation::sample_of(
            [&rows[0], &rows[1]],
            now,
            &rule.per_source,
            rule.unit,
        ))
    }

    /// Finds an earlier version's per-source LRU (`SRC_BUCKETS` in `pin_dir`) for the
    /// first install to carry into the sketch: an upgrade then gives no throttled source
    /// its burst back, and the old map (96 bytes a source) is freed once its pin is gone
    /// and the old program replaced. `false`: no such pin. A map there that is not the
    /// limiter's LRU is refused and left alone.
    pub fn find_earlier_lru(&mut self, pin_dir: &Path) -> Result<bool, Error> {
        let path = pin_dir.join(map_name::SRC_BUCKETS);
        if std::fs::symlink_metadata(&path).is_err() {
            return Ok(false);
        }
        let data = MapData::from_pin(&path)
            .map_err(map_err(format!("opening pinned map {}", path.display())))?;
        let info = data
            .info()
            .map_err(map_err(format!("reading {}", path.display())))?;
        let is_lru = matches!(info.map_type(), Ok(aya::maps::MapType::LruHash));
        if info.name_as_str() != Some(map_name::SRC_BUCKETS)
            || !is_lru
            || info.key_size() as usize != std::mem::size_of::<SourceKey>()
            || info.value_size() as usize != std::mem::size_of::<Bucket>()
        {
            return Err(Error::PinInTheWay {
                path,
                why: "not the per-source LRU of an earlier limiter (name, type or layout)".into(),
            });
        }
        let lru: HashMap<MapData, SourceKey, Bucket> = typed(
            Map::from_map_data(data).map_err(map_err("opening SRC_BUCKETS"))?,
            map_name::SRC_BUCKETS,
        )?;
        self.earlier_lru = Some((path, lru));
        Ok(true)
    }

    /// Folds each LRU bucket still holding state into its source's cells, for the rules
    /// in `kept` (slot → per-source limit and region): a cell keeps the more advanced of
    /// its own TAT and the bucket's, so upper bounds stay upper bounds. Returns how many
    /// buckets were carried.
    fn fold_lru(
        &mut self,
        lru: &HashMap<MapData, SourceKey, Bucket>,
        kept: &BTreeMap<u32, (Limit, u32)>,
    ) -> Result<u64, Error> {
        let meta = self.sketch_meta()?;
        let now = limiter_common::gcra::ticks_from_ns(limiter_fleet::clock::monotonic_ns());
        let mut carried = 0u64;
        for entry in lru.iter() {
            let (key, bucket) = entry.map_err(map_err("reading SRC_BUCKETS"))?;
            let Some((limit, region)) = kept.get(&key.slot) else {
                continue;
            };
            if sketch::at_rest(bucket.tat, now) {
                continue;
            }
            for index in sketch::cells_of(&meta, *region, &key, limit) {
                let cell = self
                    .src_sketch
                    .get(&index, 0)
                    .map_err(map_err(format!("reading SRC_SKETCH cell {index}")))?;
                if sketch::lead(bucket.tat, now) > sketch::lead(cell.tat, now) {
                    self.set_sketch_cell(index, bucket.tat)?;
                }
            }
            carried += 1;
        }
        Ok(carried)
    }

    /// The sketch's counters, summed over CPUs.
    pub fn sketch_counters(&self) -> Result<SketchCounters, Error> {
        let per_cpu = self
            .sketch_counts
            .get(&0, 0)
            .map_err(map_err("reading SKETCH_COUNTS"))?;
        let mut total = SketchCounters::default();
        for c in per_cpu.iter() {
            total.accumulate(c);
        }
        Ok(total)
    }

    /// Sets a rule's aggregate bucket (a fleet grant taking over with its token count):
    /// the TAT's word alone, atomically, so the credit beside it stays.
    pub fn set_aggregate_tat(&mut self, slot: u32, tat: u64) -> Result<(), Error> {
        self.agg_word(slot, AGG_BUCKET_TAT_OFFSET)?
            .store(tat, Ordering::SeqCst);
        Ok(())
    }

    /// Replaces a rule's fleet credit (`AggBucket::credit`) with `credit`; returns what
    /// was left of the one before (the program spends it by compare-and-swap, so the
    /// swap sees every frame it admitted).
    pub fn swap_credit(&mut self, slot: u32, credit: u64) -> Result<u64, Error> {
        Ok(self
            .agg_word(slot, AGG_BUCKET_CREDIT_OFFSET)?
            .swap(credit, Ordering::SeqCst))
    }

    /// What is left of a rule's fleet credit.
    pub fn credit_left(&self, slot: u32) -> Result<u64, Error> {
        Ok(self
            .agg_word(slot, AGG_BUCKET_CREDIT_OFFSET)?
            .load(Ordering::SeqCst))
    }

    fn agg_word(&self, slot: u32, offset: usize) -> Result<&AtomicU64, Error> {
        if slot >= MAX_RULES {
            return Err(Error::Io {
                what: format!("AGG_BUCKETS has no slot {slot}"),
                source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
            });
        }
        let bytes = MAX_RULES as usize * std::mem::size_of::<AggBucket>();
        let at = slot as usize * std::mem::size_of::<AggBucket>() + offset;
        self.agg_words.word(bytes, at).map_err(|source| Error::Io {
            what: "mapping AGG_BUCKETS (its TAT and credit words)".into(),
            source,
        })
    }

    /// A rule's aggregate bucket (its TAT).
    pub fn aggregate_bucket(&self, slot: u32) -> Result<Bucket, Error> {
        self.agg_buckets
            .get(&slot, 0)
            .map(|b| b.bucket)
            .map_err(map_err(format!("reading AGG_BUCKETS slot {slot}")))
    }
}

/// A duplicate of an array map's descriptor (for a shared mapping of its values).
fn array_fd(map: &Map, name: &str) -> Result<OwnedFd, Error> {
    match map {
        Map::Array(data) => data
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| Error::Io {
                what: format!("duplicating the {name} descriptor"),
                source: e,
            }),
        _ => Err(Error::Io {
            what: format!("{name} is not an array"),
            source: std::io::Error::from(std::io::ErrorKind::InvalidData),
        }),
    }
}

/// A `BPF_F_MMAPABLE` array's values as 8-byte words shared with the program, mapped
/// read-write at first use (readers such as `limiter stats` never map it).
struct SharedWords {
    fd: OwnedFd,
    mapping: std::sync::OnceLock<Mapping>,
}

/// A shared read-write mapping of the first `words` 8-byte values of a `BPF_F_MMAPABLE`
/// array map (which the kernel page-aligns), unmapped on drop. The program reads and
/// updates those words atomically, so they are only ever touched as atomics here.
struct Mapping {
    base: std::ptr::NonNull<AtomicU64>,
    words: usize,
}

// SAFETY: the mapping is shared memory touched only through atomics; the pointer is
// never handed out beyond `&self`'s lifetime.
unsafe impl Send for Mapping {}
// SAFETY: as above: every access is an atomic operation.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(fd: &OwnedFd, words: usize) -> std::io::Result<Mapping> {
        let bytes = words * std::mem::size_of::<AtomicU64>();
        // SAFETY: a shared read-write mapping of the array map's values; unmapped on drop.
        let mapped = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if mapped == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = std::ptr::NonNull::new(mapped.cast::<AtomicU64>())
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidData))?;
        Ok(Mapping { base, words })
    }

    fn words(&self) -> &[AtomicU64] {
        // SAFETY: `words` aligned 8-byte values (a page-aligned mapping), alive as long as
        // `self`.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.words) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `Mapping::new`, no longer referenced (its words are
        // borrowed from `&self` only).
        unsafe {
            libc::munmap(
                self.base.as_ptr().cast(),
                self.words * std::mem::size_of::<AtomicU64>(),
            )
        };
    }
}

impl SharedWords {
    fn new(fd: OwnedFd) -> SharedWords {
        SharedWords {
            fd,
            mapping: std::sync::OnceLock::new(),
        }
    }

    /// The first `words` words, mapped at first use (every call asks for the same count).
    fn words(&self, words: usize) -> std::io::Result<&[AtomicU64]> {
        let mapping = match self.mapping.get() {
            Some(m) => m,
            None => {
                // `Maps` is used from one thread at a time (behind the daemon's lock); if
                // another caller won a race, this mapping is dropped (unmapped).
                let _ = self.mapping.set(Mapping::new(&self.fd, words)?);
                self.mapping
                    .get()
                    .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::Other))?
            }
        };
        Ok(mapping.words())
    }

    /// The aligned word at byte offset `at` of a mapping of the first `bytes` bytes.
    fn word(&self, bytes: usize, at: usize) -> std::io::Result<&AtomicU64> {
        if !at.is_multiple_of(8) || at + 8 > bytes {
            return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
        }
        self.words(bytes / 8)?
            .get(at / 8)
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    }
}

fn replace_trie<const N: usize>(
    trie: &mut Trie<N>,
    entries: &[PrefixEntry<N>],
    family: &str,
) -> Result<(), Error> {
    let stale: Vec<Key<[u8; N]>> = trie
        .keys()
        .collect::<Result<_, _>>()
        .map_err(map_err(format!("listing the idle {family} prefix table")))?;
    for key in stale {
        trie.remove(&key)
            .map_err(map_err(format!("clearing the idle {family} prefix table")))?;
    }
    for entry in entries {
        let key = Key::new(entry.prefix_len, entry.addr);
        trie.insert(&key, entry.rules, 0).map_err(map_err(format!(
            "writing {family} prefix {:?}/{}",
            entry.addr, entry.prefix_len
        )))?;
    }
    Ok(())
}

/// A sample of the sketch's cells: how many were read, how many hold state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SketchFill {
    pub sampled: u32,
    pub busy: u32,
}

impl SketchFill {
    /// The busy share, 0..=1.
    pub fn ratio(&self) -> f64 {
        if self.sampled == 0 {
            0.0
        } else {
            f64::from(self.busy) / f64::from(self.sampled)
        }
    }
}

/// 128 bits from the kernel's random pool (getrandom(2) via /dev/urandom).
fn random_seed() -> Result<[u64; 2], Error> {
    use std::io::Read as _;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Error::Io {
            what: "reading /dev/urandom for the sketch's seed".into(),
            source: e,
        })?;
    let (a, b) = bytes.split_at(8);
    let word = |s: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(s);
        u64::from_ne_bytes(w)
    };
    Ok([word(a), word(b)])
}
