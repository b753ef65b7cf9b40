//! `--kv-ram` without a value: the KV pool's RAM budget taken from the memory available at
//! start ([`engine::memory::available`]: the smaller of the memory cgroups' limits and
//! `MemAvailable`). The pool gets half of what remains after
//! the model file and the prompt cache's RAM tier (the other half is for the compute buffers,
//! the tokenizer and the system's page cache, which reads the spilled pages), and at least
//! [`MIN_KV_RAM`].

/// The smallest budget the default gives, however little memory is left.
pub const MIN_KV_RAM: u64 = 64 << 20;

/// The default budget: half of `available` less the model file and the cache's RAM tier
/// (`cache_ram`, when it has a limit), at least [`MIN_KV_RAM`].
pub fn kv_ram_rule(available: u64, model_bytes: u64, cache_ram: u64) -> u64 {
    let tier = if cache_ram == u64::MAX { 0 } else { cache_ram };
    (available.saturating_sub(model_bytes).saturating_sub(tier) / 2).max(MIN_KV_RAM)
}

/// Bytes of memory available to this process now ([`engine::memory::available`]).
pub fn memory_available() -> Option<u64> {
    engine::memory::available()
}
