//! `kvstore`: KV blocks between a RAM budget and disk (not implemented yet).
