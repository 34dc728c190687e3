"""One pass over a COCO annotation file: what the checks need, without its polygons.

At COCO size (COCO train2017: 118,287 images, 860,001 polygon instances, a
448 MB file) ``json.load`` costs seconds and gigabytes, and mmdet parses the
file again when it builds the dataset.  :func:`read_coco_summary` keeps only
the categories, the number of images, the categories that have an annotation
and a sample of the image file names, without decoding the polygons; a file
that is not valid JSON gets its error at the position in the file as written.
"""
import json
import re
from typing import Any, FrozenSet, List, NamedTuple, Optional, Tuple

from ..errors import DataError


#: a polygon list, ``"segmentation": [[x0, y0, x1, ...], ...]``, or a box, ``"bbox": [x, y, w, h]``:
#: most of a COCO file's bytes. Only numbers, commas and white space between the brackets, so
#: a match is always a whole JSON array outside any string (``"`` cannot occur in it), and
#: replacing it by ``0`` keeps a valid file valid and an invalid one invalid (but for
#: malformed numbers in such an array).
_NUMBER_ARRAYS = re.compile(rb'"(segmentation|bbox)"\s*:\s*(?:'
                            rb'\[\s*\[[-+.0-9eE,\s]*\](?:\s*,\s*\[[-+.0-9eE,\s]*\])*\s*\]'
                            rb'|\[[-+.0-9eE,\s]*\])')


class CocoSummary(NamedTuple):
    """What the checks need of a COCO-format annotation file."""

    #: the file's ``categories`` entries
    categories: List[dict]
    #: how many entries ``images`` has
    num_images: int
    #: the ``category_id`` of every non-crowd annotation (once each)
    annotated: FrozenSet[Any]
    #: the ``file_name`` of up to :data:`IMAGES_CHECKED` images, spread over the file
    image_files: Tuple[str, ...] = ()


#: how many image files of an annotation file the checks look for on disk
IMAGES_CHECKED = 2000


def read_coco_summary(path: str) -> Optional[CocoSummary]:
    """Parse an annotation file once; the :class:`CocoSummary` of it (None if not a JSON object).

    The polygons and boxes are not decoded (:data:`_NUMBER_ARRAYS`) and the annotation and
    image entries are dropped as they are parsed, so memory stays a fraction
    of what ``json.load`` of the file takes.

    Raises:
        DataError: the file cannot be read or is not valid JSON.
    """
    annotated = set()
    image_files: List[str] = []

    def keep(obj: dict) -> Optional[dict]:
        if 'image_id' in obj and 'category_id' in obj:  # an annotation
            if not obj.get('iscrowd', 0):
                try:
                    annotated.add(obj['category_id'])
                except TypeError:  # an unhashable id names no category
                    pass
            return None
        if 'file_name' in obj and 'id' in obj:  # an image entry
            if isinstance(obj['file_name'], str):
                image_files.append(obj['file_name'])
            return None
        return obj

    try:
        with open(path, 'rb') as f:
            text = _NUMBER_ARRAYS.sub(rb'"\1": 0', f.read())
        top = json.loads(text, object_hook=keep)
    except (OSError, ValueError) as err:
        raise DataError(f'annotation file {path!r} cannot be read as JSON: '
                        f'{_exact_json_error(path, err)}') from None
    if not isinstance(top, dict):
        return None
    images = top.get('images')
    categories = top.get('categories')
    return CocoSummary(
        categories=[c for c in categories if isinstance(c, dict)]
        if isinstance(categories, list) else [],
        num_images=len(images) if isinstance(images, list) else int(bool(images)),
        annotated=frozenset(annotated),
        image_files=tuple(image_files[::max(1, -(-len(image_files) // IMAGES_CHECKED))]))


def _exact_json_error(path: str, err: Exception) -> Exception:
    """The error of the file as written: positions in ``err`` are those of the reduced text.

    Only a file that cannot be read is parsed a second time.
    """
    if isinstance(err, OSError):
        return err
    try:
        with open(path, 'rb') as f:
            json.loads(f.read())
    except (OSError, ValueError) as exact:
        return exact
    return err
