//! The answer to the integrity check of NVIDIA's CUDA runtime (≥ 12).
//!
//! A CUDA 12 or 13 runtime, after it has fetched the driver's private
//! tables, asks the integrity-check table for a 16-byte token and compares it
//! with the one it computes itself. The token is HMAC-MD2 (RFC 1319 MD2 in
//! RFC 2104's construction, 16-byte blocks) under a fixed key, over: the
//! driver version, the runtime's request value, the process and thread ids,
//! the addresses of two tables and of the check function, the runtime's
//! time stamp, then each device's UUID and PCI location. Request values
//! ending in 0 or 1 get fixed tokens.
//!
//! The hash is pure Rust here and tested against RFC 1319's vectors; the
//! layout of the hashed record is what NVIDIA's runtime accepts (the runtime
//! tests in `tests/runtime.rs` fail if any field is off).

/// MD2's substitution table, built from the digits of π (RFC 1319, 3.2).
const PI_SUBST: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, 98, 167, 5, 243, 192, 199,
    115, 140, 152, 147, 43, 217, 188, 76, 130, 202, 30, 155, 87, 60, 253, 212, 224, 22, 103, 66,
    111, 24, 138, 23, 229, 18, 190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47,
    238, 122, 169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, 128, 127, 93,
    154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, 255, 25, 48, 179, 72, 165, 181, 209,
    215, 94, 146, 42, 172, 86, 170, 198, 79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226,
    156, 116, 4, 241, 69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, 27,
    96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, 85, 71, 163, 35, 221, 81,
    175, 58, 195, 92, 249, 206, 186, 197, 234, 38, 44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205,
    244, 65, 129, 77, 82, 106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74,
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, 242, 239, 183, 14,
    102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, 49, 68, 80, 180, 143, 237, 31, 26,
    219, 153, 141, 51, 159, 17, 131, 20,
];

/// MD2's block (and digest) size.
const BLOCK: usize = 16;
/// Rounds of MD2's compression function.
const ROUNDS: u8 = 18;
/// HMAC's inner pad byte.
const IPAD: u8 = 0x36;
/// HMAC's outer pad byte.
const OPAD: u8 = 0x5c;

/// MD2 (RFC 1319).
#[derive(Clone)]
pub struct Md2 {
    state: [u8; 3 * BLOCK],
    checksum: [u8; BLOCK],
    block: [u8; BLOCK],
    filled: usize,
}

impl Default for Md2 {
    fn default() -> Self {
        Self::new()
    }
}

impl Md2 {
    /// A fresh hash.
    pub fn new() -> Self {
        Self {
            state: [0; 3 * BLOCK],
            checksum: [0; BLOCK],
            block: [0; BLOCK],
            filled: 0,
        }
    }

    fn compress(&mut self) {
        let mut last = self.checksum[BLOCK - 1];
        for i in 0..BLOCK {
            self.state[BLOCK + i] = self.block[i];
            self.state[2 * BLOCK + i] = self.block[i] ^ self.state[i];
            self.checksum[i] ^= PI_SUBST[usize::from(self.block[i] ^ last)];
            last = self.checksum[i];
        }
        let mut t = 0u8;
        for round in 0..ROUNDS {
            for x in &mut self.state {
                *x ^= PI_SUBST[usize::from(t)];
                t = *x;
            }
            t = t.wrapping_add(round);
        }
    }

    /// Feeds bytes.
    pub fn update(&mut self, data: &[u8]) {
        for &b in data {
            self.block[self.filled] = b;
            self.filled += 1;
            if self.filled == BLOCK {
                self.compress();
                self.filled = 0;
            }
        }
    }

    /// The digest.
    pub fn finish(mut self) -> [u8; BLOCK] {
        let pad = (BLOCK - self.filled) as u8;
        self.update(&vec![pad; usize::from(pad)]);
        let checksum = self.checksum;
        self.update(&checksum);
        let mut out = [0; BLOCK];
        out.copy_from_slice(&self.state[..BLOCK]);
        out
    }
}

/// HMAC-MD2 with a one-block key.
pub fn hmac_md2(key: &[u8; BLOCK], message: &[&[u8]]) -> [u8; BLOCK] {
    let pad = |p: u8| key.map(|k| k ^ p);
    let mut inner = Md2::new();
    inner.update(&pad(IPAD));
    for part in message {
        inner.update(part);
    }
    let mut outer = Md2::new();
    outer.update(&pad(OPAD));
    outer.update(&inner.finish());
    outer.finish()
}

/// The runtime's key.
const KEY: [u8; BLOCK] = [
    0x14, 0x6A, 0xDD, 0xAE, 0x53, 0xA9, 0xA7, 0x52, 0xAA, 0x08, 0x41, 0x36, 0x0B, 0xF5, 0x5A, 0x9F,
];
/// Tokens for request values ending in 0 and 1.
const FIXED_TOKENS: [[u64; 2]; 2] = [
    [0x3341_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8],
    [0x1841_181C_03CB_675C, 0x8ED3_83AA_1F4C_D1E8],
];

/// What the token covers besides the devices.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    /// The version `cuDriverGetVersion` reports.
    pub driver_version: u32,
    /// The runtime's request value.
    pub request: u32,
    /// Process id.
    pub pid: u32,
    /// The calling thread (`pthread_self`, low 32 bits).
    pub thread: u32,
    /// Address of the runtime-interface table.
    pub cudart_table: u64,
    /// Address of the integrity-check table.
    pub check_table: u64,
    /// Address of the check function.
    pub check_fn: u64,
    /// The runtime's time stamp.
    pub unix_seconds: u64,
}

/// A device as the token covers it.
#[derive(Debug, Clone, Copy)]
pub struct DeviceId {
    /// `cuDeviceGetUuid`.
    pub uuid: [u8; 16],
    /// PCI domain, bus and device numbers.
    pub pci: [i32; 3],
}

/// The token for a runtime's request.
pub fn token(caller: &Caller, devices: &[DeviceId]) -> [u64; 2] {
    match caller.request % 10 {
        0 => return FIXED_TOKENS[0],
        1 => return FIXED_TOKENS[1],
        _ => {}
    }
    let mut record = Vec::with_capacity(48);
    for v in [
        caller.driver_version,
        caller.request,
        caller.pid,
        caller.thread,
    ] {
        record.extend_from_slice(&v.to_le_bytes());
    }
    for v in [
        caller.cudart_table,
        caller.check_table,
        caller.check_fn,
        caller.unix_seconds,
    ] {
        record.extend_from_slice(&v.to_le_bytes());
    }
    let mut device_bytes = Vec::with_capacity(devices.len() * 28);
    for d in devices {
        device_bytes.extend_from_slice(&d.uuid);
        for v in d.pci {
            device_bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    let digest = hmac_md2(&KEY, &[&record, &device_bytes]);
    let (lo, hi) = digest.split_at(8);
    [
        u64::from_le_bytes(lo.try_into().unwrap_or_default()),
        u64::from_le_bytes(hi.try_into().unwrap_or_default()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(d: [u8; 16]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn md2(s: &str) -> String {
        let mut h = Md2::new();
        h.update(s.as_bytes());
        hex(h.finish())
    }

    #[test]
    fn md2_matches_rfc_1319() {
        assert_eq!(md2(""), "8350e5a3e24c153df2275c9f80692773");
        assert_eq!(md2("a"), "32ec01ec4a6dac72c0ab96fb34c0b5d1");
        assert_eq!(md2("abc"), "da853b0d3f88d99b30283a69e6ded6bb");
        assert_eq!(md2("message digest"), "ab4f496bfb2a530b219ff33031fe06b0");
        assert_eq!(
            md2("abcdefghijklmnopqrstuvwxyz"),
            "4e8ddff3650292ab5a4108c3aa47940b"
        );
        assert_eq!(
            md2("12345678901234567890123456789012345678901234567890123456789012345678901234567890"),
            "d5976f79d83d3a0dc9806c3c66f3efd8"
        );
    }

    #[test]
    fn feeding_in_pieces_changes_nothing() {
        let text = b"the quick brown fox jumps over the lazy dog, twice over";
        let mut whole = Md2::new();
        whole.update(text);
        let mut parts = Md2::new();
        for c in text.chunks(5) {
            parts.update(c);
        }
        assert_eq!(whole.finish(), parts.finish());
    }

    #[test]
    fn hmac_is_the_nested_construction() {
        let key = [7u8; 16];
        let mut inner = Md2::new();
        inner.update(&key.map(|k| k ^ IPAD));
        inner.update(b"abc");
        let mut outer = Md2::new();
        outer.update(&key.map(|k| k ^ OPAD));
        outer.update(&inner.finish());
        assert_eq!(hmac_md2(&key, &[b"a", b"bc"]), outer.finish());
    }

    #[test]
    fn tokens_cover_every_field() {
        let c = Caller {
            driver_version: 12090,
            request: 12092,
            pid: 1,
            thread: 2,
            cudart_table: 3,
            check_table: 4,
            check_fn: 5,
            unix_seconds: 6,
        };
        let d = [DeviceId {
            uuid: [9; 16],
            pci: [0, 1, 0],
        }];
        let base = token(&c, &d);
        assert_ne!(token(&Caller { thread: 3, ..c }, &d), base);
        assert_ne!(
            token(
                &Caller {
                    unix_seconds: 7,
                    ..c
                },
                &d
            ),
            base
        );
        assert_ne!(token(&c, &[]), base);
        assert_eq!(
            token(
                &Caller {
                    request: 12090,
                    ..c
                },
                &d
            ),
            FIXED_TOKENS[0]
        );
        assert_eq!(
            token(
                &Caller {
                    request: 13001,
                    ..c
                },
                &d
            ),
            FIXED_TOKENS[1]
        );
    }
}
