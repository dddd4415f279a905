//! The records table's row type as the database has it now, for the hot
//! calls' records (`rec`, read whole: `store::row`).
//!
//! A connection learns a row type's fields once, when a statement first
//! returns it, and keeps them for its life (tokio-postgres caches types per
//! connection; PostgreSQL does not re-describe a prepared statement whose
//! result is still "a row of idempotency_keys"). When the table changes
//! while the server runs (a column added by a migration of a rolling
//! upgrade, or by an operator), the connections opened before keep reading
//! the old fields. Their statements still ran and committed, so their
//! records must still be read: by the fields the catalog lists now, looked
//! up once per change (one lookup at a time) and kept here for every
//! connection.
//!
//! A value says how many fields it has and each one's type, not their
//! names, so a list is taken for a value's when both match. Columns are
//! added at the end and dropped in place: a column the records read could
//! only be mistaken for another if columns before it were dropped and as
//! many of its type added after, and the records read every column up to
//! the last one of the table's own (the administrators', added last).
//!
//! The statements that return plain columns instead are prepared anew
//! when PostgreSQL refuses them after such a change
//! (`mux::prepared_anew_if_stale`).

use std::sync::{Arc, Mutex};

use tokio_postgres::Row;
use tokio_postgres::types::{Field, Kind, Type};

use super::{CallTime, Store, StoreError, row};
use crate::domain::Record;

/// The row type's fields as last read from the catalog. A value is read by
/// them only if it has exactly their number and types.
#[derive(Default)]
pub(super) struct RowTypes {
    current: Mutex<Option<Arc<Vec<Field>>>>,
    /// Held while the catalog is read, so that the calls answered after a
    /// change look it up once rather than each on a pooled connection.
    lookup: tokio::sync::Mutex<()>,
}

impl RowTypes {
    fn known(&self) -> Option<Arc<Vec<Field>>> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn learn(&self, fields: Arc<Vec<Field>>) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(fields);
    }
}

/// A row type's columns, in the order a composite value of it lists them,
/// by the type's schema and name (not its OID: on Citus a record may come
/// from a worker, where the same table's type has another OID, while this
/// asks the coordinator, which lists the same columns).
const FIELDS: &str = "SELECT a.attname::text, a.atttypid \
     FROM pg_catalog.pg_attribute a \
     JOIN pg_catalog.pg_type t ON a.attrelid = t.typrelid \
     JOIN pg_catalog.pg_namespace n ON t.typnamespace = n.oid \
     WHERE n.nspname = $1 AND t.typname = $2 AND a.attnum > 0 AND NOT a.attisdropped \
     ORDER BY a.attnum";

impl Store {
    /// The record in a row's column `rec`: read by the fields the row's
    /// connection knows, or, when the table changed since, by those the
    /// catalog lists now.
    pub(super) async fn record_in_rec(
        &self,
        row: &Row,
        time: CallTime,
    ) -> Result<Record, StoreError> {
        let (at, ty) = row::rec_column(row)?;
        if let Some(record) = row::record_in_rec_as(row, at, row::fields_of(ty)?)? {
            return Ok(record);
        }
        // Boxed: every call's future (a waiting Acquire's among them, ten
        // thousand of which are the server's memory) would otherwise carry
        // room for a catalog lookup that runs once per change.
        Box::pin(self.record_in_changed_rec(row, at, ty, time)).await
    }

    async fn record_in_changed_rec(
        &self,
        row: &Row,
        at: usize,
        ty: &Type,
        time: CallTime,
    ) -> Result<Record, StoreError> {
        let by_known = || match self.row_types.known() {
            Some(fields) => row::record_in_rec_as(row, at, &fields),
            None => Ok(None),
        };
        if let Some(record) = by_known()? {
            return Ok(record);
        }
        let _lookup = self.row_types.lookup.lock().await;
        // Another call may have looked it up meanwhile.
        if let Some(record) = by_known()? {
            return Ok(record);
        }
        let fields = Arc::new(self.catalog_fields(ty, time).await?);
        let record = row::record_in_rec_as(row, at, &fields)?.ok_or_else(|| {
            StoreError::Corrupt(format!("rec's fields are not those of {ty} in the catalog"))
        })?;
        tracing::warn!(
            row_type = %ty,
            fields = fields.len(),
            "the records table's columns changed since connections learnt them; \
             records are read by its columns now"
        );
        self.row_types.learn(fields);
        Ok(record)
    }

    async fn catalog_fields(&self, ty: &Type, time: CallTime) -> Result<Vec<Field>, StoreError> {
        let rows = self
            .query(FIELDS, &[&ty.schema(), &ty.name()], time)
            .await?;
        rows.iter()
            .map(|row| {
                let name: String = row.try_get(0)?;
                let oid: u32 = row.try_get(1)?;
                // A type without a built-in OID (an enum, a domain, an
                // extension's type: only an operator's column) has another
                // OID on each Citus node, and no record reads its column:
                // OID 0 lets a value's field there be of any type.
                let ty = Type::from_oid(oid)
                    .unwrap_or_else(|| Type::new(format!("{oid}"), 0, Kind::Simple, String::new()));
                Ok(Field::new(name, ty))
            })
            .collect()
    }
}
