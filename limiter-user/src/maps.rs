//! Typed access to the program's maps, from a loaded object or from pins. Installing a
//! rule table writes the idle generation, then flips `CONTROL.generation`.

use std::{
    collections::{BTreeMap, BTreeSet},
    os::fd::{AsFd as _, AsRawFd as _},
    path::Path,
};

use aya::{
    maps::{
        lpm_trie::Key, Array, HashMap, LpmTrie, Map, MapData, MapError, PerCpuArray, PerCpuValues,
    },
    util::nr_cpus,
    Ebpf,
};
use limiter_common::abi::{
    map_name, rule_index, AggBucket, Bucket, Control, FragmentKey, FragmentRecord, GlobalCounters,
    Handoff, HandoffCounters, HeaderCounters, HostEntry, PrefixRules, RuleConfig, RuleCounters,
    RuleCpuState, SourceKey, SynCounters, HOST_SLOTS, MAX_RULES, RULE_IN_USE,
};

use crate::{
    error::Error,
    ruleset::{HostTable, PrefixEntry, RuleTable},
};

type Trie<const N: usize> = LpmTrie<MapData, [u8; N], PrefixRules>;

/// The maps the daemon reads and writes.
pub struct Maps {
    control: Array<MapData, Control>,
    rules: Array<MapData, RuleConfig>,
    v4: [Trie<4>; 2],
    v6: [Trie<16>; 2],
    agg_buckets: Array<MapData, AggBucket>,
    src_buckets: HashMap<MapData, SourceKey, Bucket>,
    /// A second handle on SRC_BUCKETS for batch reads (aya's HashMap hides its fd).
    src_buckets_raw: MapData,
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
    /// Per generation, the `HOSTS` slots that may hold an entry; `None` until this
    /// process has written the generation (pins adopted from an earlier daemon).
    hosts_used: [Option<BTreeSet<u32>>; 2],
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

impl Maps {
    /// Takes the maps out of a loaded object.
    pub fn from_ebpf(ebpf: &mut Ebpf) -> Result<Maps, Error> {
        Self::build(|name| ebpf.take_map(name).ok_or(Error::MissingMap(name)))
    }

    /// Opens the maps pinned under `pin_dir` by a running (or previous) daemon.
    pub fn from_pins(pin_dir: &Path) -> Result<Maps, Error> {
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
        let (src_buckets, src_buckets_raw) = {
            let map = take(map_name::SRC_BUCKETS)?;
            let Map::LruHashMap(data) = &map else {
                return Err(Error::MissingMap(map_name::SRC_BUCKETS));
            };
            let id = data
                .info()
                .map_err(map_err("reading SRC_BUCKETS info"))?
                .id();
            let raw = MapData::from_id(id).map_err(map_err("reopening SRC_BUCKETS"))?;
            (typed(map, map_name::SRC_BUCKETS)?, raw)
        };
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
            agg_buckets: typed(take(map_name::AGG_BUCKETS)?, map_name::AGG_BUCKETS)?,
            src_buckets,
            src_buckets_raw,
            rule_counters: typed(take(map_name::RULE_COUNTERS)?, map_name::RULE_COUNTERS)?,
            global_counters: typed(take(map_name::GLOBAL_COUNTERS)?, map_name::GLOBAL_COUNTERS)?,
            header_counters: take(map_name::HEADER_COUNTERS)
                .ok()
                .map(|m| typed(m, map_name::HEADER_COUNTERS))
                .transpose()?,
            fragments: take(map_name::FRAGMENTS)
                .ok()
                .map(|m| typed(m, map_name::FRAGMENTS))
                .transpose()?,
            hosts: typed(take(map_name::HOSTS)?, map_name::HOSTS)?,
            rule_syns: typed(take(map_name::RULE_SYNS)?, map_name::RULE_SYNS)?,
            handoff: take(map_name::HANDOFF)
                .ok()
                .map(|m| typed(m, map_name::HANDOFF))
                .transpose()?,
            handoff_counters: take(map_name::HANDOFF_COUNTS)
                .ok()
                .map(|m| typed(m, map_name::HANDOFF_COUNTS))
                .transpose()?,
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

        // Slots whose per-source buckets must go: given to another rule, or freed.
        let mut changed: BTreeSet<u32> = live
            .keys()
            .filter(|slot| table.rule(**slot).is_none())
            .copied()
            .collect();
        for (slot, rule) in &table.rules {
            let same_owner = live
                .get(slot)
                .is_some_and(|old| old.name_bytes() == rule.name_bytes());
            if !same_owner {
                self.reset_slot(*slot)?;
                changed.insert(*slot);
            }
        }

        replace_trie(&mut self.v4[next as usize], &table.v4, "IPv4")?;
        replace_trie(&mut self.v6[next as usize], &table.v6, "IPv6")?;
        self.replace_hosts(next, &HostTable::build(table))?;
        let wanted: BTreeMap<u32, &RuleConfig> = table
            .rules
            .iter()
            .map(|(slot, rule)| (*slot, rule))
            .collect();
        for slot in 0..MAX_RULES {
            let rule = wanted
                .get(&slot)
                .copied()
                .copied()
                .unwrap_or(RuleConfig::EMPTY);
            self.rules
                .set(rule_index(next, slot), rule, 0)
                .map_err(map_err(format!("writing RULES slot {slot}")))?;
        }
        self.set_control(Control {
            generation: next,
            ..control
        })?;
        // After the flip: from now on no packet meters these slots under their old rules,
        // so nothing can bring an old rule's bucket back (a source of the new rule that
        // got a bucket in the meantime starts again from a full one, as a new rule should).
        if !changed.is_empty() {
            match self.purge_source_buckets(&changed) {
                Ok(purged) => tracing::debug!(?changed, purged, "per-source buckets cleared"),
                // Less accurate, never less available: the rules are in force.
                Err(e) => tracing::error!(
                    ?changed,
                    "clearing the per-source buckets of reassigned rule slots: {e}"
                ),
            }
        }
        Ok(())
    }

    /// Deletes every per-source bucket of the rules in `slots` (keys are slot + source).
    /// One pass over `SRC_BUCKETS` in batches of 4096 (BPF_MAP_LOOKUP_BATCH), then batched
    /// deletes: a few hundred syscalls for a million entries. Returns how many went.
    pub fn purge_source_buckets(&self, slots: &BTreeSet<u32>) -> Result<u64, Error> {
        let fd = self.src_buckets_raw.fd().as_fd().as_raw_fd();
        let key_size = std::mem::size_of::<SourceKey>();
        let mut doomed: Vec<SourceKey> = Vec::new();
        batch_scan(fd, key_size, std::mem::size_of::<Bucket>(), |keys| {
            for raw in keys.chunks_exact(key_size) {
                // SAFETY: `raw` holds key_size bytes the kernel wrote as a SourceKey, a
                // plain-old-data struct; read unaligned.
                let key: SourceKey = unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
                if slots.contains(&key.slot) {
                    doomed.push(key);
                }
            }
        })
        .map_err(|e| Error::Io {
            what: "listing SRC_BUCKETS".into(),
            source: e,
        })?;
        batch_delete(fd, &doomed).map_err(|e| Error::Io {
            what: "deleting per-source buckets from SRC_BUCKETS".into(),
            source: e,
        })
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
            .map_err(map_err(format!("resetting RULE_SYNS slot {slot}")))
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

    /// A per-source bucket, if the source has one (it may have been evicted).
    pub fn source_bucket(&self, key: &SourceKey) -> Result<Option<Bucket>, Error> {
        match self.src_buckets.get(key, 0) {
            Ok(b) => Ok(Some(b)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(Error::Map {
                what: "reading SRC_BUCKETS".into(),
                source: e,
            }),
        }
    }

    /// Sets a per-source bucket (seeding state: tests, benchmarks).
    pub fn set_source_bucket(&mut self, key: &SourceKey, bucket: Bucket) -> Result<(), Error> {
        self.src_buckets
            .insert(key, bucket, 0)
            .map_err(map_err("writing SRC_BUCKETS"))
    }

    /// How many per-source buckets exist (BPF_MAP_LOOKUP_BATCH: a few syscalls per
    /// hundred thousand entries, instead of one per entry).
    pub fn source_bucket_count(&self) -> Result<u64, Error> {
        batch_count(
            self.src_buckets_raw.fd().as_fd().as_raw_fd(),
            std::mem::size_of::<SourceKey>(),
            std::mem::size_of::<Bucket>(),
        )
        .map_err(|e| Error::Io {
            what: "counting SRC_BUCKETS entries".into(),
            source: e,
        })
    }

    /// Sets a rule's aggregate bucket (a fleet grant taking over with its token count).
    pub fn set_aggregate_tat(&mut self, slot: u32, tat: u64) -> Result<(), Error> {
        self.agg_buckets
            .set(slot, AggBucket::new(tat), 0)
            .map_err(map_err(format!("writing AGG_BUCKETS slot {slot}")))
    }

    /// A rule's aggregate bucket (its TAT).
    pub fn aggregate_bucket(&self, slot: u32) -> Result<Bucket, Error> {
        self.agg_buckets
            .get(&slot, 0)
            .map(|b| b.bucket)
            .map_err(map_err(format!("reading AGG_BUCKETS slot {slot}")))
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

/// `union bpf_attr` for BPF_MAP_LOOKUP_BATCH.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// Counts a hash map's entries with batched lookups.
fn batch_count(fd: i32, key_size: usize, value_size: usize) -> std::io::Result<u64> {
    let mut total = 0u64;
    batch_scan(fd, key_size, value_size, |keys| {
        total += (keys.len() / key_size) as u64;
    })?;
    Ok(total)
}

const BPF_MAP_DELETE_BATCH: libc::c_long = 27;

/// Deletes `keys` from a hash map in batches (BPF_MAP_DELETE_BATCH). A key already gone
/// (evicted by the LRU meanwhile) is skipped. Returns how many were deleted.
fn batch_delete(fd: i32, keys: &[SourceKey]) -> std::io::Result<u64> {
    const CHUNK: usize = 4096;
    let mut deleted = 0u64;
    let mut rest = keys;
    while !rest.is_empty() {
        let chunk = &rest[..rest.len().min(CHUNK)];
        let mut attr = BatchAttr {
            keys: chunk.as_ptr() as u64,
            count: chunk.len() as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        // SAFETY: attr points at `chunk.len()` keys of the map's key size.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_DELETE_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        // The kernel stops at the first key it cannot delete; `count` says how many went.
        let done = (attr.count as usize).min(chunk.len());
        deleted += done as u64;
        if rc < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::ENOENT) {
                return Err(err);
            }
            // Skip the key that was gone.
            rest = &rest[(done + 1).min(rest.len())..];
        } else {
            rest = &rest[chunk.len()..];
        }
    }
    Ok(deleted)
}

/// Walks a hash map with batched lookups, handing each batch's keys (packed) to `f`.
fn batch_scan(
    fd: i32,
    key_size: usize,
    value_size: usize,
    mut f: impl FnMut(&[u8]),
) -> std::io::Result<()> {
    const CHUNK: usize = 4096;
    let mut keys = vec![0u8; key_size * CHUNK];
    // Per-CPU maps would need more; SRC_BUCKETS is a plain LRU hash.
    let mut values = vec![0u8; value_size * CHUNK];
    let mut cursor = [0u8; 8];
    let mut next = [0u8; 8];
    let mut first = true;
    loop {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { cursor.as_ptr() as u64 },
            out_batch: next.as_mut_ptr() as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: fd as u32,
            ..BatchAttr::default()
        };
        // SAFETY: attr points to valid buffers sized for CHUNK keys and values.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        let got = (attr.count as usize).min(CHUNK);
        f(&keys[..got * key_size]);
        if rc < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENOENT) {
                return Ok(());
            }
            return Err(err);
        }
        cursor = next;
        first = false;
    }
}
