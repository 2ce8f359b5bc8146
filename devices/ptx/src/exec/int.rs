//! Integer arithmetic and logic on a warp's lanes.

use super::*;

// `with_int!` instantiates each body for every width, including u64 (a no-op cast there).
#[allow(clippy::unnecessary_cast)]
pub(super) fn exec_ibin(regs: &mut [[u64; 32]], m: u32, k: IBin, ty: Ty, d: Reg, a: Reg, b: Reg) {
    match k {
        IBin::Add => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| (x as T).wrapping_add(y as T)
                as u64)
        ),
        IBin::Sub => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| (x as T).wrapping_sub(y as T)
                as u64)
        ),
        IBin::AddSat => map2(regs, m, d, a, b, |x, y| {
            (x as i32).saturating_add(y as i32) as u32 as u64
        }),
        IBin::SubSat => map2(regs, m, d, a, b, |x, y| {
            (x as i32).saturating_sub(y as i32) as u32 as u64
        }),
        IBin::MulLo => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| (x as T).wrapping_mul(y as T)
                as u64)
        ),
        IBin::MulHi => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| {
                (((x as T) as i128).wrapping_mul((y as T) as i128) >> T::BITS) as T as u64
            })
        ),
        IBin::MulWide => with_int!(
            ty,
            T,
            map2(
                regs,
                m,
                d,
                a,
                b,
                |x, y| ((x as T) as i128).wrapping_mul((y as T) as i128) as u64
            )
        ),
        IBin::Mul24Lo | IBin::Mul24Hi => {
            let signed = ty.is_signed();
            let hi = k == IBin::Mul24Hi;
            map2(regs, m, d, a, b, |x, y| {
                let (x, y) = if signed {
                    (sext_bits(x, 24) as i64, sext_bits(y, 24) as i64)
                } else {
                    ((x & 0xff_ffff) as i64, (y & 0xff_ffff) as i64)
                };
                let p = x * y;
                (if hi { (p >> 16) as u64 } else { p as u64 }) & 0xffff_ffff
            })
        }
        IBin::Div => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| {
                let (x, y) = (x as T, y as T);
                if y == 0 {
                    !(0 as T) as u64
                } else {
                    x.wrapping_div(y) as u64
                }
            })
        ),
        IBin::Rem => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| {
                let (x, y) = (x as T, y as T);
                if y == 0 {
                    x as u64
                } else {
                    x.wrapping_rem(y) as u64
                }
            })
        ),
        IBin::Min => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| (x as T).min(y as T) as u64)
        ),
        IBin::Max => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| (x as T).max(y as T) as u64)
        ),
        IBin::And => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| ((x as T) & (y as T)) as u64)
        ),
        IBin::Or => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| ((x as T) | (y as T)) as u64)
        ),
        IBin::Xor => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| ((x as T) ^ (y as T)) as u64)
        ),
        IBin::Shl => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| {
                let n = y as u32;
                if n >= T::BITS {
                    0
                } else {
                    ((x as T) << n) as u64
                }
            })
        ),
        IBin::Shr => with_int!(
            ty,
            T,
            map2(regs, m, d, a, b, |x, y| {
                let n = y as u32;
                let v = x as T;
                if n >= T::BITS {
                    (v >> (T::BITS - 1) >> 1) as u64
                } else {
                    (v >> n) as u64
                }
            })
        ),
        IBin::Bmsk { clamp } => map2(regs, m, d, a, b, |x, y| {
            let (pos, len) = if clamp {
                ((x as u32).min(32), (y as u32).min(32))
            } else {
                (x as u32 & 31, y as u32 & 31)
            };
            let mask = lowmask(len.min(32)) << pos;
            mask & 0xffff_ffff
        }),
        IBin::AddCarry { .. } => {}
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn exec_addc(
    regs: &mut [[u64; 32]],
    m: u32,
    ty: Ty,
    d: Reg,
    a: Reg,
    b: Reg,
    sub: bool,
    cin: bool,
    cout: bool,
    carry: u32,
) -> u32 {
    let bits = ty.bits();
    let (av, bv) = (regs[a as usize], regs[b as usize]);
    let mask = lowmask(bits);
    let mut out = [0u64; 32];
    let mut newc = carry;
    for l in 0..32 {
        let x = u128::from(av[l] & mask);
        let y = u128::from(bv[l] & mask);
        let ci = u128::from(cin && (carry >> l & 1 != 0));
        let (r, c) = if sub {
            let need = y + ci;
            (x.wrapping_sub(need), x < need)
        } else {
            let s = x + y + ci;
            (s, s >> bits != 0)
        };
        out[l] = (r as u64) & mask;
        if cout && m >> l & 1 != 0 {
            newc = (newc & !(1 << l)) | (u32::from(c) << l);
        }
    }
    write_masked(&mut regs[d as usize], m, &out);
    newc
}

#[allow(clippy::too_many_arguments)]
pub(super) fn exec_madc(
    regs: &mut [[u64; 32]],
    m: u32,
    ty: Ty,
    d: Reg,
    a: Reg,
    b: Reg,
    c: Reg,
    hi: bool,
    cin: bool,
    cout: bool,
    carry: u32,
) -> u32 {
    let bits = ty.bits();
    let signed = ty.is_signed();
    let (av, bv, cv) = (regs[a as usize], regs[b as usize], regs[c as usize]);
    let mask = lowmask(bits);
    let mut out = [0u64; 32];
    let mut newc = carry;
    for l in 0..32 {
        let p: u128 = if signed {
            (sext_bits(av[l], bits) as i64 as i128)
                .wrapping_mul(sext_bits(bv[l], bits) as i64 as i128) as u128
        } else {
            u128::from(av[l] & mask) * u128::from(bv[l] & mask)
        };
        let part = if hi {
            (p >> bits) as u64 & mask
        } else {
            p as u64 & mask
        };
        let ci = u128::from(cin && (carry >> l & 1 != 0));
        let s = u128::from(part) + u128::from(cv[l] & mask) + ci;
        out[l] = s as u64 & mask;
        if cout && m >> l & 1 != 0 {
            newc = (newc & !(1 << l)) | (u32::from(s >> bits != 0) << l);
        }
    }
    write_masked(&mut regs[d as usize], m, &out);
    newc
}

// `with_int!` instantiates each body for every width, including u64 (a no-op cast there).
#[allow(clippy::unnecessary_cast)]
pub(super) fn exec_iun(regs: &mut [[u64; 32]], m: u32, k: IUn, ty: Ty, d: Reg, a: Reg) {
    match k {
        IUn::Abs => with_int!(
            ty,
            T,
            map1(regs, m, d, a, |x| {
                let v = x as T;
                (if v < v.wrapping_sub(v) {
                    v.wrapping_neg()
                } else {
                    v
                }) as u64
            })
        ),
        IUn::Neg => with_int!(
            ty,
            T,
            map1(regs, m, d, a, |x| (x as T).wrapping_neg() as u64)
        ),
        IUn::Not => with_int!(ty, T, map1(regs, m, d, a, |x| (!(x as T)) as u64)),
        IUn::Cnot => with_int!(ty, T, map1(regs, m, d, a, |x| u64::from((x as T) == 0))),
        IUn::Popc => {
            let bits = ty.bits();
            map1(regs, m, d, a, |x| {
                u64::from((x & lowmask(bits)).count_ones())
            })
        }
        IUn::Clz => {
            let bits = ty.bits();
            map1(regs, m, d, a, |x| {
                u64::from((x & lowmask(bits)).leading_zeros() - (64 - bits))
            })
        }
        IUn::Brev => {
            let bits = ty.bits();
            map1(regs, m, d, a, |x| {
                (x & lowmask(bits)).reverse_bits() >> (64 - bits)
            })
        }
        IUn::Bfind { shiftamt } => {
            let bits = ty.bits();
            let signed = ty.is_signed();
            map1(regs, m, d, a, |x| {
                let mut v = x & lowmask(bits);
                if signed && (v >> (bits - 1)) & 1 != 0 {
                    v = !v & lowmask(bits);
                }
                if v == 0 {
                    0xffff_ffff
                } else {
                    let pos = 63 - v.leading_zeros();
                    u64::from(if shiftamt { bits - 1 - pos } else { pos })
                }
            })
        }
    }
}

#[allow(clippy::too_many_arguments)]
// `with_int!` instantiates each body for every width, including u64 (a no-op cast there).
#[allow(clippy::unnecessary_cast)]
pub(super) fn exec_itern(
    regs: &mut [[u64; 32]],
    m: u32,
    k: ITern,
    ty: Ty,
    d: Reg,
    a: Reg,
    b: Reg,
    c: Reg,
) {
    match k {
        ITern::MadLo => {
            with_int!(
                ty,
                T,
                map3(regs, m, d, a, b, c, |x, y, z| (x as T)
                    .wrapping_mul(y as T)
                    .wrapping_add(z as T)
                    as u64)
            )
        }
        ITern::MadHi => with_int!(
            ty,
            T,
            map3(regs, m, d, a, b, c, |x, y, z| {
                let hi = (((x as T) as i128).wrapping_mul((y as T) as i128) >> T::BITS) as T;
                hi.wrapping_add(z as T) as u64
            })
        ),
        ITern::MadLoSat => map3(regs, m, d, a, b, c, |x, y, z| {
            let hi = ((x as i32 as i64) * (y as i32 as i64)) >> 32;
            (hi + (z as i32 as i64)).clamp(i64::from(i32::MIN), i64::from(i32::MAX)) as i32 as u32
                as u64
        }),
        ITern::MadWide => with_int!(
            ty,
            T,
            map3(regs, m, d, a, b, c, |x, y, z| ((x as T) as i128)
                .wrapping_mul((y as T) as i128)
                .wrapping_add(z as i128)
                as u64)
        ),
        ITern::Mad24Lo | ITern::Mad24Hi => {
            let signed = ty.is_signed();
            let hi = k == ITern::Mad24Hi;
            map3(regs, m, d, a, b, c, |x, y, z| {
                let (x, y) = if signed {
                    (sext_bits(x, 24) as i64, sext_bits(y, 24) as i64)
                } else {
                    ((x & 0xff_ffff) as i64, (y & 0xff_ffff) as i64)
                };
                let p = x * y;
                let part = if hi { (p >> 16) as u64 } else { p as u64 };
                part.wrapping_add(z) & 0xffff_ffff
            })
        }
        ITern::Sad => with_int!(
            ty,
            T,
            map3(regs, m, d, a, b, c, |x, y, z| {
                let (x, y) = (x as T, y as T);
                let diff = if x > y {
                    x.wrapping_sub(y)
                } else {
                    y.wrapping_sub(x)
                };
                diff.wrapping_add(z as T) as u64
            })
        ),
        ITern::Bfe => {
            let bits = ty.bits();
            let signed = ty.is_signed();
            map3(regs, m, d, a, b, c, |x, p, l| {
                let pos = (p & 0xff) as u32;
                let len = (l & 0xff) as u32;
                let v = x & lowmask(bits);
                if len == 0 {
                    return 0;
                }
                let sbit = if signed {
                    let sb = (pos + len - 1).min(bits - 1);
                    (v >> sb) & 1
                } else {
                    0
                };
                let avail = bits.saturating_sub(pos);
                let take = len.min(avail);
                let mut r = if take == 0 {
                    0
                } else {
                    (v >> pos) & lowmask(take)
                };
                if sbit != 0 {
                    r |= !lowmask(take) & lowmask(bits);
                }
                if signed { sext_bits(r, bits) } else { r }
            })
        }
        ITern::Dp4a { sa, sb } => map3(regs, m, d, a, b, c, |x, y, z| {
            let mut acc = z as u32 as i64;
            if sa || sb {
                acc = z as u32 as i32 as i64;
            }
            for i in 0..4 {
                let xa = (x >> (8 * i)) as u8;
                let yb = (y >> (8 * i)) as u8;
                let xa = if sa {
                    i64::from(xa as i8)
                } else {
                    i64::from(xa)
                };
                let yb = if sb {
                    i64::from(yb as i8)
                } else {
                    i64::from(yb)
                };
                acc = acc.wrapping_add(xa * yb);
            }
            acc as u32 as u64
        }),
        ITern::Dp2a { sa, sb, hi } => map3(regs, m, d, a, b, c, |x, y, z| {
            let mut acc = if sa || sb {
                z as u32 as i32 as i64
            } else {
                z as u32 as i64
            };
            for i in 0..2 {
                let xa = (x >> (16 * i)) as u16;
                let yb = (y >> (8 * (i + if hi { 2 } else { 0 }))) as u8;
                let xa = if sa {
                    i64::from(xa as i16)
                } else {
                    i64::from(xa)
                };
                let yb = if sb {
                    i64::from(yb as i8)
                } else {
                    i64::from(yb)
                };
                acc = acc.wrapping_add(xa * yb);
            }
            acc as u32 as u64
        }),
        ITern::Szext { signed, clamp } => {
            let bits = ty.bits();
            map2(regs, m, d, a, b, |x, y| {
                let n = if clamp {
                    (y as u32).min(bits)
                } else {
                    y as u32 % bits
                };
                let v = x & lowmask(n);
                let r = if signed && n > 0 { sext_bits(v, n) } else { v };
                r & lowmask(bits)
            })
        }
        ITern::Video(v) => map3(regs, m, d, a, b, c, |x, y, z| {
            u64::from(v.eval(x as u32, y as u32, z as u32))
        }),
        ITern::MadCarry { .. } => {}
    }
}

pub(super) fn prmt(a: u32, b: u32, c: u32, mode: u8) -> u32 {
    let bytes = (u64::from(b) << 32) | u64::from(a);
    let byte = |i: u32| ((bytes >> (8 * (i & 7))) & 0xff) as u32;
    if mode == 0 {
        let mut r = 0u32;
        for i in 0..4 {
            let sel = (c >> (4 * i)) & 0xf;
            let mut v = byte(sel & 7);
            if sel & 8 != 0 {
                v = if v & 0x80 != 0 { 0xff } else { 0 };
            }
            r |= v << (8 * i);
        }
        return r;
    }
    const TABLE: [[[u32; 4]; 4]; 6] = [
        [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]], // f4e (d.b0..b3)
        [[0, 7, 6, 5], [1, 0, 7, 6], [2, 1, 0, 7], [3, 2, 1, 0]], // b4e
        [[0, 0, 0, 0], [1, 1, 1, 1], [2, 2, 2, 2], [3, 3, 3, 3]], // rc8
        [[0, 1, 2, 3], [1, 1, 2, 3], [2, 2, 2, 3], [3, 3, 3, 3]], // ecl
        [[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 2, 2], [0, 1, 2, 3]], // ecr
        [[0, 1, 0, 1], [2, 3, 2, 3], [0, 1, 0, 1], [2, 3, 2, 3]], // rc16
    ];
    let t = &TABLE[usize::from(mode - 1).min(5)][(c & 3) as usize];
    let mut r = 0u32;
    for (i, &s) in t.iter().enumerate() {
        r |= byte(s) << (8 * i);
    }
    r
}

pub(super) fn lop3(a: u32, b: u32, c: u32, lut: u8) -> u32 {
    let mut r = 0u32;
    for i in 0..8u32 {
        if lut >> i & 1 == 0 {
            continue;
        }
        let ta = if i & 4 != 0 { a } else { !a };
        let tb = if i & 2 != 0 { b } else { !b };
        let tc = if i & 1 != 0 { c } else { !c };
        r |= ta & tb & tc;
    }
    r
}

pub(super) fn fns(mask: u32, base: u32, offset: i32) -> u32 {
    let base = base.min(31);
    if offset == 0 {
        return if mask >> base & 1 != 0 {
            base
        } else {
            u32::MAX
        };
    }
    let mut count = offset.unsigned_abs();
    if offset > 0 {
        for pos in base..32 {
            if mask >> pos & 1 != 0 {
                count -= 1;
                if count == 0 {
                    return pos;
                }
            }
        }
    } else {
        for pos in (0..=base).rev() {
            if mask >> pos & 1 != 0 {
                count -= 1;
                if count == 0 {
                    return pos;
                }
            }
        }
    }
    u32::MAX
}
