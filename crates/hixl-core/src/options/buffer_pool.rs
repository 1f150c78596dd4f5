//! The relay buffer pool option.

use super::size::parse_uint;

/// The relay buffer pool (`BufferPool`, written `"N:SIZE_MB"`). `"0:0"` disables it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferPool {
    /// Number of buffers.
    pub count: u32,
    /// Size of each buffer in MiB.
    pub size_mb: u32,
}

impl Default for BufferPool {
    /// HIXL's default, `4:8`.
    fn default() -> Self {
        BufferPool {
            count: 4,
            size_mb: 8,
        }
    }
}

impl BufferPool {
    /// The disabled pool, `0:0` (Mooncake always sets this).
    pub const DISABLED: BufferPool = BufferPool {
        count: 0,
        size_mb: 0,
    };

    /// Whether the pool is enabled (anything but `0:0`).
    pub fn is_enabled(&self) -> bool {
        self.count != 0
    }

    pub(super) fn parse(v: &str) -> Result<Self, String> {
        let (n, m) = v
            .split_once(':')
            .ok_or("expected \"N:SIZE_MB\", e.g. \"4:8\"")?;
        let num = |s: &str, what: &str| {
            parse_uint(s.trim())
                .and_then(|x| u32::try_from(x).ok())
                .ok_or_else(|| format!("{what} {s:?} is not an integer in [0, {}]", u32::MAX))
        };
        let pool = BufferPool {
            count: num(n, "count")?,
            size_mb: num(m, "size")?,
        };
        if (pool.count == 0) != (pool.size_mb == 0) {
            return Err("count and size must both be 0 (disabled) or both be non-zero".to_owned());
        }
        Ok(pool)
    }
}

impl std::fmt::Display for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.count, self.size_mb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::tests::{opts, set_err};

    #[test]
    fn buffer_pool_values() {
        assert_eq!(
            opts(&[("BufferPool", "0:0")]).unwrap().buffer_pool,
            BufferPool::DISABLED
        );
        let pool = opts(&[("BufferPool", " 16 : 2 ")]).unwrap().buffer_pool;
        assert_eq!(
            pool,
            BufferPool {
                count: 16,
                size_mb: 2
            }
        );
        assert_eq!(pool.to_string(), "16:2");
        for v in ["4:0", "0:8"] {
            assert!(set_err("BufferPool", v).contains("both be 0"), "{v}");
        }
        for v in ["4", "4:8:1", "-1:8", "a:b", "4294967296:1", "", ":"] {
            set_err("BufferPool", v);
        }
    }
}
