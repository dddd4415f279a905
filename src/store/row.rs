//! Rows of `idempotency_keys` (as the SQL functions return them) into
//! records.
//!
//! A record comes in one of two shapes, read by the same code:
//!
//! - **As a row's columns**, from a function that returns `SETOF
//!   idempotency_keys` (Get, Watch, an administrator's delete, the recovery
//!   feed): [`record`].
//! - **As one composite column `rec`**, from a function that returns the
//!   record beside its decision or outcome (Acquire, Complete, a batch of
//!   them, ExtendLease, an administrator's action): [`record_in_rec`]. The
//!   statement selects `rec` whole rather than `(rec).*`: PostgreSQL
//!   expands `(rec).*` by one field selection per column, each walking the
//!   row from its start, which cost a replayed Acquire run alone a tenth to
//!   a sixth of its backend's CPU; `rec` whole is sent in one pass
//!   (`record_send`) and taken apart here (docs/performance.md, "The record
//!   as one column").

use tokio_postgres::Row;
use tokio_postgres::types::{Field, FromSql, Kind, Type};

use super::{StoreError, names};
use crate::domain::{
    AdminNote, DueReason, DueRecord, Fingerprint, Lease, LeaseToken, Record, Status, StoredResult,
    Tenant,
};

/// Declares [`Columns`]: the columns a record is read from, by name.
macro_rules! columns {
    ($($name:ident),* $(,)?) => {
        /// Where each column a record is read from sits in a row, found in
        /// one pass over the row's columns. Reading a column by name would
        /// search the row's 30-odd columns again for each of the 26 read,
        /// once per call answered. Every statement whose rows become
        /// records returns the whole `idempotency_keys` row, so a row
        /// without one of these columns is corrupt, whether or not its
        /// record would have read that column.
        struct Columns {
            $($name: usize,)*
        }

        impl Columns {
            fn of<'n>(names: impl Iterator<Item = &'n str>) -> Result<Self, StoreError> {
                $(let mut $name = None;)*
                for (at, name) in names.enumerate() {
                    // The first column of a name, as a read by name takes.
                    match name {
                        $(stringify!($name) => {
                            $name.get_or_insert(at);
                        })*
                        _ => {}
                    }
                }
                Ok(Columns {
                    $($name: $name.ok_or_else(|| {
                        StoreError::Corrupt(format!("the row has no column {}", stringify!($name)))
                    })?,)*
                })
            }
        }
    };
}

columns!(
    scope,
    idempotency_key,
    status,
    fingerprint,
    attempt_count,
    max_attempts,
    lease_token,
    lease_request_id,
    lease_expires_at,
    fencing_token,
    next_retry_at,
    last_error,
    last_error_at,
    checkpoint,
    result,
    result_content_type,
    result_status_code,
    result_ref,
    created_at,
    updated_at,
    completed_at,
    expires_at,
    admin_action,
    admin_actor,
    admin_reason,
    admin_at,
);

fn count<'r>(values: &impl Values<'r>, at: usize, column: &str) -> Result<u32, StoreError> {
    let value: i32 = values.get(at)?;
    u32::try_from(value).map_err(|_| StoreError::Corrupt(format!("{column} is negative")))
}

/// A record from a row of `idempotency_keys`'s columns.
pub(super) fn record(row: &Row) -> Result<Record, StoreError> {
    read(&row)
}

/// A record from a row's composite column `rec`, a whole `idempotency_keys`
/// row, read by the fields its connection knows `rec`'s type to have. A
/// `Corrupt` error if the value does not have them: the table changed since
/// the connection learnt its type (`Store::record_in_rec` reads it then).
pub fn record_in_rec(row: &Row) -> Result<Record, StoreError> {
    let (at, ty) = rec_column(row)?;
    record_in_rec_as(row, at, fields_of(ty)?)?.ok_or_else(|| {
        StoreError::Corrupt(format!(
            "rec's fields are not those its connection knows {ty} to have"
        ))
    })
}

/// Where a row's column `rec` is, and its type.
pub(super) fn rec_column(row: &Row) -> Result<(usize, &Type), StoreError> {
    row.columns()
        .iter()
        .enumerate()
        .find(|(_, column)| column.name() == "rec")
        .map(|(at, column)| (at, column.type_()))
        .ok_or_else(|| StoreError::Corrupt("the row has no column rec".into()))
}

/// A row type's fields as its connection learnt them.
pub(super) fn fields_of(ty: &Type) -> Result<&[Field], StoreError> {
    match ty.kind() {
        Kind::Composite(fields) => Ok(fields),
        _ => Err(StoreError::Corrupt(format!(
            "rec is of type {ty}, not a row type"
        ))),
    }
}

/// The record in the row's column `at`, read as a value with `fields`;
/// `None` when the value has other fields (another count, or another type
/// somewhere).
pub(super) fn record_in_rec_as(
    row: &Row,
    at: usize,
    fields: &[Field],
) -> Result<Option<Record>, StoreError> {
    let Composite(raw) = row.try_get(at)?;
    let Some(values) = field_values(raw, fields)? else {
        return Ok(None);
    };
    read(&Fields { fields, values }).map(Some)
}

fn read<'r>(values: &impl Values<'r>) -> Result<Record, StoreError> {
    let at = Columns::of(values.names())?;
    let status: &str = values.get(at.status)?;
    let status = names::status(status)
        .ok_or_else(|| StoreError::Corrupt(format!("unknown status {status:?}")))?;
    let fencing_token: i64 = values.get(at.fencing_token)?;
    let fencing_token = u64::try_from(fencing_token)
        .map_err(|_| StoreError::Corrupt("fencing_token is negative".into()))?;
    let attempt_count = count(values, at.attempt_count, "attempt_count")?;
    let lease_expires_at = values.get(at.lease_expires_at)?;
    let result = match status {
        Status::Succeeded => Some(StoredResult {
            result: values
                .get::<Option<Vec<u8>>>(at.result)?
                .unwrap_or_default(),
            content_type: values.get(at.result_content_type)?,
            status_code: values.get(at.result_status_code)?,
            result_ref: values.get(at.result_ref)?,
        }),
        _ => None,
    };
    Ok(Record {
        scope: values.get(at.scope)?,
        key: values.get(at.idempotency_key)?,
        status,
        fingerprint: Fingerprint::stored(values.get(at.fingerprint)?),
        attempt_count,
        max_attempts: count(values, at.max_attempts, "max_attempts")?,
        lease_expires_at,
        next_retry_at: values.get(at.next_retry_at)?,
        last_error: values.get(at.last_error)?,
        last_error_at: values.get(at.last_error_at)?,
        result,
        checkpoint: values.get(at.checkpoint)?,
        fencing_token,
        created_at: values.get(at.created_at)?,
        updated_at: values.get(at.updated_at)?,
        completed_at: values.get(at.completed_at)?,
        expires_at: values.get(at.expires_at)?,
        lease: Lease {
            token: LeaseToken::from_uuid(values.get(at.lease_token)?),
            attempt: attempt_count,
            expires_at: lease_expires_at,
            fencing_token,
        },
        lease_request_id: values.get(at.lease_request_id)?,
        admin: admin_note(values, &at)?,
    })
}

/// The last administrator's action (`sql/migrations/0002_admin.sql`), when
/// the row has one.
fn admin_note<'r>(values: &impl Values<'r>, at: &Columns) -> Result<Option<AdminNote>, StoreError> {
    let Some(action) = values.get::<Option<String>>(at.admin_action)? else {
        return Ok(None);
    };
    Ok(Some(AdminNote {
        action,
        actor: values
            .get::<Option<String>>(at.admin_actor)?
            .unwrap_or_default(),
        reason: values
            .get::<Option<String>>(at.admin_reason)?
            .unwrap_or_default(),
        at: values
            .get::<Option<_>>(at.admin_at)?
            .ok_or_else(|| StoreError::Corrupt("admin_action without admin_at".into()))?,
    }))
}

/// A claimed due row: PROCESSING (lease run out) or FAILED that no holder
/// completed (reclaimed by the sweeper) means the holder died; any other
/// FAILED row failed and its retry came due.
pub(super) fn due_record(row: &Row) -> Result<DueRecord, StoreError> {
    let record = record(row)?;
    let holder_completed = row.try_get::<_, Option<&str>>("lease_outcome")?.is_some();
    let reason = match record.status {
        Status::Failed if holder_completed => DueReason::RetryDue,
        _ => DueReason::LeaseExpired,
    };
    Ok(DueRecord {
        tenant: Tenant::new(row.try_get::<_, String>("tenant")?),
        record,
        reason,
    })
}

/// The named values a record is read from, by position.
trait Values<'r> {
    /// The values' names, in position order.
    fn names(&self) -> impl Iterator<Item = &str>;
    /// The value at `at` as a `T`.
    fn get<T: FromSql<'r>>(&self, at: usize) -> Result<T, StoreError>;
}

/// A row's columns.
impl<'r> Values<'r> for &'r Row {
    fn names(&self) -> impl Iterator<Item = &str> {
        self.columns().iter().map(|column| column.name())
    }

    fn get<T: FromSql<'r>>(&self, at: usize) -> Result<T, StoreError> {
        Ok(self.try_get(at)?)
    }
}

/// A composite value's fields: its type's fields and each one's bytes.
struct Fields<'r> {
    fields: &'r [Field],
    values: Vec<Option<&'r [u8]>>,
}

impl<'r> Values<'r> for Fields<'r> {
    fn names(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().map(Field::name)
    }

    fn get<T: FromSql<'r>>(&self, at: usize) -> Result<T, StoreError> {
        let field = &self.fields[at];
        let ty: &Type = field.type_();
        if !T::accepts(ty) {
            return Err(StoreError::Corrupt(format!(
                "rec.{} is of type {ty}, which {} cannot hold",
                field.name(),
                std::any::type_name::<T>()
            )));
        }
        T::from_sql_nullable(ty, self.values[at])
            .map_err(|error| StoreError::Corrupt(format!("rec.{}: {error}", field.name())))
    }
}

/// A composite value's bytes as the database sent them, not yet taken apart.
struct Composite<'r>(&'r [u8]);

impl<'r> FromSql<'r> for Composite<'r> {
    fn from_sql(_: &Type, raw: &'r [u8]) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Composite(raw))
    }

    fn accepts(ty: &Type) -> bool {
        matches!(ty.kind(), Kind::Composite(_))
    }
}

/// Takes apart a composite value in PostgreSQL's binary form (`record_send`):
/// the number of fields, then for each its type's OID, its length (-1 for
/// NULL) and that many bytes. `None` when its fields are not `fields` (their
/// number, or a field's type, differs; a field of type OID 0 takes any
/// type); an error when the bytes do not hold what they say.
fn field_values<'r>(
    raw: &'r [u8],
    fields: &[Field],
) -> Result<Option<Vec<Option<&'r [u8]>>>, StoreError> {
    let corrupt = |what: String| StoreError::Corrupt(format!("rec: {what}"));
    let mut rest = raw;
    let count = take_int(&mut rest).ok_or_else(|| corrupt("ends early".into()))?;
    if usize::try_from(count).ok() != Some(fields.len()) {
        return Ok(None);
    }
    let mut values = Vec::with_capacity(fields.len());
    for field in fields {
        let ends_early = || corrupt(format!("{} ends early", field.name()));
        let oid = take_int(&mut rest).ok_or_else(ends_early)?;
        // OID 0: a field of any type (`row_type`: one no reader reads).
        let known = field.type_().oid();
        if known != 0 && oid.cast_unsigned() != known {
            return Ok(None);
        }
        let len = take_int(&mut rest).ok_or_else(ends_early)?;
        values.push(match usize::try_from(len) {
            Err(_) if len == -1 => None,
            Err(_) => return Err(corrupt(format!("{} has length {len}", field.name()))),
            Ok(len) => {
                let (value, after) = rest.split_at_checked(len).ok_or_else(ends_early)?;
                rest = after;
                Some(value)
            }
        });
    }
    if !rest.is_empty() {
        return Err(corrupt(format!("{} bytes after its fields", rest.len())));
    }
    Ok(Some(values))
}

/// The big-endian `int4` at the start of `rest`, which then starts after it.
fn take_int(rest: &mut &[u8]) -> Option<i32> {
    let (bytes, after) = rest.split_first_chunk::<4>()?;
    *rest = after;
    Some(i32::from_be_bytes(*bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields() -> Vec<Field> {
        vec![
            Field::new("idempotency_key".into(), Type::TEXT),
            Field::new("attempt_count".into(), Type::INT4),
            Field::new("last_error_at".into(), Type::TIMESTAMPTZ),
        ]
    }

    /// `("k-1", 3, NULL)` as `record_send` writes it.
    fn encoded() -> Vec<u8> {
        let mut raw = 3i32.to_be_bytes().to_vec();
        for (ty, value) in [
            (Type::TEXT, Some(&b"k-1"[..])),
            (Type::INT4, Some(&3i32.to_be_bytes()[..])),
            (Type::TIMESTAMPTZ, None),
        ] {
            raw.extend(ty.oid().to_be_bytes());
            match value {
                Some(value) => {
                    raw.extend(i32::try_from(value.len()).unwrap().to_be_bytes());
                    raw.extend(value);
                }
                None => raw.extend((-1i32).to_be_bytes()),
            }
        }
        raw
    }

    #[test]
    fn a_composite_value_is_read_field_by_field_with_its_nulls() {
        let fields = fields();
        let raw = encoded();
        let values = Fields {
            fields: &fields,
            values: field_values(&raw, &fields).unwrap().unwrap(),
        };
        assert_eq!(
            values.names().collect::<Vec<_>>(),
            ["idempotency_key", "attempt_count", "last_error_at"]
        );
        assert_eq!(values.get::<&str>(0).unwrap(), "k-1");
        assert_eq!(values.get::<i32>(1).unwrap(), 3);
        assert_eq!(
            values
                .get::<Option<chrono::DateTime<chrono::Utc>>>(2)
                .unwrap(),
            None
        );
        // A NULL where a value is required, and a field read as a type it
        // cannot be, are corrupt rows rather than panics.
        assert!(matches!(
            values.get::<chrono::DateTime<chrono::Utc>>(2),
            Err(StoreError::Corrupt(_))
        ));
        assert!(matches!(values.get::<i64>(1), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn a_composite_value_whose_bytes_do_not_hold_what_they_say_is_corrupt() {
        let fields = fields();
        let raw = encoded();
        let corrupt = |raw: &[u8]| {
            matches!(
                field_values(raw, &fields),
                Err(StoreError::Corrupt(why)) if why.starts_with("rec: ")
            )
        };
        // Cut anywhere after its count, it ends early.
        for len in 4..raw.len() {
            assert!(corrupt(&raw[..len]), "cut at {len}");
        }
        assert!(corrupt(&raw[..3]));
        let mut longer = raw.clone();
        longer.push(0);
        assert!(corrupt(&longer));
        // The last field's length: -1 is NULL, below it nothing.
        let mut below_null = raw.clone();
        let at = below_null.len() - 4;
        below_null[at..].copy_from_slice(&(-2i32).to_be_bytes());
        assert!(corrupt(&below_null));
        assert!(matches!(field_values(&raw, &fields), Ok(Some(_))));
    }

    /// A value of a row type that changed since its connection learnt it:
    /// not corrupt, but not readable by the fields known.
    #[test]
    fn a_composite_value_with_other_fields_is_told_apart() {
        let fields = fields();
        let raw = encoded();
        let mut other_count = raw.clone();
        other_count[..4].copy_from_slice(&2i32.to_be_bytes());
        assert!(matches!(field_values(&other_count, &fields), Ok(None)));
        let mut other_type = raw.clone();
        other_type[4..8].copy_from_slice(&Type::BYTEA.oid().to_be_bytes());
        assert!(matches!(field_values(&other_type, &fields), Ok(None)));
        let one_more: Vec<Field> = fields
            .iter()
            .cloned()
            .chain([Field::new("operator_note".into(), Type::TEXT)])
            .collect();
        assert!(matches!(field_values(&raw, &one_more), Ok(None)));
        // A field known by OID 0 (a column of a type that has another OID
        // on each Citus node) takes a value of any type.
        let any_last: Vec<Field> = fields[..2]
            .iter()
            .cloned()
            .chain([Field::new(
                "operator_note".into(),
                Type::new("custom".into(), 0, Kind::Simple, String::new()),
            )])
            .collect();
        assert!(matches!(field_values(&raw, &any_last), Ok(Some(_))));
    }
}
