//! Reading `datasets`-written arrow columns by field name, whatever offset width or view type
//! the writer chose (`string` / `large_string` / `string_view`, `binary` / `large_binary`,
//! `list` / `large_list`): `datasets` and pyarrow versions differ, and so do the field orders
//! of its structs (Image is `{bytes, path}` in one version and `{path, bytes}` in another).
use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, StructArray};

/// The list at `row` of a list column (`None` when the value is null or the column is no list).
pub(crate) fn list_at(array: &dyn Array, row: usize) -> Option<ArrayRef> {
    if array.is_null(row) {
        return None;
    }
    if let Some(list) = array.as_list_opt::<i32>() {
        return Some(list.value(row));
    }
    array.as_list_opt::<i64>().map(|list| list.value(row))
}

/// The string at `i` (`None` when null or not a string column).
pub(crate) fn str_at(array: &dyn Array, i: usize) -> Option<&str> {
    if array.is_null(i) {
        return None;
    }
    if let Some(a) = array.as_string_opt::<i32>() {
        return Some(a.value(i));
    }
    if let Some(a) = array.as_string_opt::<i64>() {
        return Some(a.value(i));
    }
    array.as_string_view_opt().map(|a| a.value(i))
}

/// The bytes at `i` (`None` when null or not a binary column).
pub(crate) fn bytes_at(array: &dyn Array, i: usize) -> Option<&[u8]> {
    if array.is_null(i) {
        return None;
    }
    if let Some(a) = array.as_binary_opt::<i32>() {
        return Some(a.value(i));
    }
    if let Some(a) = array.as_binary_opt::<i64>() {
        return Some(a.value(i));
    }
    array.as_binary_view_opt().map(|a| a.value(i))
}

/// Whether `array` holds strings (of any offset width or view).
pub(crate) fn is_string(array: &dyn Array) -> bool {
    use arrow_schema::DataType::{LargeUtf8, Utf8, Utf8View};
    matches!(array.data_type(), Utf8 | LargeUtf8 | Utf8View)
}

/// The field `name` of a struct array.
pub(crate) fn field<'a>(array: &'a StructArray, name: &str) -> Option<&'a ArrayRef> {
    array.column_by_name(name)
}

/// An id column's value at `row` as text: strings as they are, integers in decimal.
pub(crate) fn id_at(array: &dyn Array, row: usize) -> Option<String> {
    use arrow_array::types::{Int32Type, Int64Type, UInt32Type, UInt64Type};
    if array.is_null(row) {
        return None;
    }
    if let Some(s) = str_at(array, row) {
        return Some(s.to_string());
    }
    let int = array
        .as_primitive_opt::<Int64Type>()
        .map(|a| a.value(row).to_string())
        .or_else(|| {
            array
                .as_primitive_opt::<Int32Type>()
                .map(|a| a.value(row).to_string())
        })
        .or_else(|| {
            array
                .as_primitive_opt::<UInt64Type>()
                .map(|a| a.value(row).to_string())
        })
        .or_else(|| {
            array
                .as_primitive_opt::<UInt32Type>()
                .map(|a| a.value(row).to_string())
        });
    int
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{BinaryArray, LargeBinaryArray, LargeStringArray, StringArray};
    use std::sync::Arc;

    #[test]
    fn strings_and_bytes_of_either_width_read_the_same() {
        let small = StringArray::from(vec![Some("a"), None]);
        let large = LargeStringArray::from(vec![Some("a"), None]);
        assert_eq!(
            (str_at(&small, 0), str_at(&large, 0)),
            (Some("a"), Some("a"))
        );
        assert_eq!((str_at(&small, 1), str_at(&large, 1)), (None, None));
        let b = BinaryArray::from(vec![Some(&b"xy"[..])]);
        let lb = LargeBinaryArray::from(vec![Some(&b"xy"[..])]);
        assert_eq!(bytes_at(&b, 0), bytes_at(&lb, 0));
        // Fields by name, whatever their order.
        let fields = vec![
            (
                Arc::new(arrow_schema::Field::new(
                    "path",
                    arrow_schema::DataType::Utf8,
                    true,
                )),
                Arc::new(StringArray::from(vec!["p.jpg"])) as ArrayRef,
            ),
            (
                Arc::new(arrow_schema::Field::new(
                    "bytes",
                    arrow_schema::DataType::Binary,
                    true,
                )),
                Arc::new(BinaryArray::from(vec![Some(&b"\xff"[..])])) as ArrayRef,
            ),
        ];
        let image = StructArray::from(fields);
        let bytes = field(&image, "bytes").and_then(|a| bytes_at(a.as_ref(), 0));
        assert_eq!(bytes, Some(&b"\xff"[..]));
    }
}
