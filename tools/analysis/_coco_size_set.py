"""A COCO-format set the size of COCO 2017, for the startup benchmark.

``instances_train2017.json`` / ``instances_val2017.json`` with COCO's image and instance
counts, its 80 categories and ids, polygons of 20-30 points, every image entry a link
to one small JPEG; written once into a folder and reused (``benchmark_startup.json``
names the version, scale and seed).  Used by ``benchmark_startup.py``; mmdet has no
generator of annotation files of this size.
"""
import json
import os
import os.path as osp

#: COCO 2017's sizes (instances_train2017.json / instances_val2017.json)
COCO_SIZES = {'train2017': (118287, 860001), 'val2017': (5000, 36781)}
#: COCO's 80 category ids (1-90 with gaps), in the order of its files
COCO_CAT_IDS = [i for i in range(1, 91) if i not in (12, 26, 29, 30, 45, 66, 68, 69, 71, 83)]
#: COCO images are about 640 x 480; the one JPEG every entry points at
IMAGE_SIZE = (640, 480)
#: bump when the generated files change, so that a kept --data-dir is rewritten
DATA_VERSION = 2


def _polygon_annotations(rng, image_ids, first_id: int, width: int, height: int) -> list:
    """COCO annotations, one polygon (a tenth of them two) of 20-30 points each."""
    import numpy as np
    n = len(image_ids)
    points = rng.integers(20, 31, size=(n, 2))
    # object sizes from a few pixels to most of the image, as in COCO (many small ones);
    # every polygon inside the image (a clipped one could lose all its area)
    radius = np.exp(rng.uniform(np.log(4), np.log(0.3 * min(width, height)), size=n))
    # a second polygon (a tenth of the objects): a smaller part beside the first
    size = radius[:, None] * np.array([1., 0.4])
    cx = rng.uniform(radius, width - 2.2 * radius)[:, None] + np.array([0., 1.6]) * radius[:, None]
    cy = rng.uniform(radius, height - radius)[:, None] + np.zeros(2)
    angles = np.sort(rng.uniform(0, 2 * np.pi, size=(n, 2, 30)), axis=-1)
    radii = size[..., None] * rng.uniform(0.6, 1.0, size=(n, 2, 30))
    xs = (cx[..., None] + radii * np.cos(angles)).round(2)
    ys = (cy[..., None] + radii * np.sin(angles)).round(2)
    two = rng.uniform(size=n) < 0.1
    cats = rng.choice(COCO_CAT_IDS, size=n)
    anns = []
    for i in range(n):
        polys, area, x0, y0, x1, y1 = [], 0., width, height, 0., 0.
        for p in range(2 if two[i] else 1):
            k = int(points[i, p])
            x, y = xs[i, p, :k], ys[i, p, :k]
            polys.append(np.stack([x, y], axis=1).ravel().tolist())
            area += 0.5 * abs(float(np.dot(x, np.roll(y, 1)) - np.dot(y, np.roll(x, 1))))
            x0, y0 = min(x0, float(x.min())), min(y0, float(y.min()))
            x1, y1 = max(x1, float(x.max())), max(y1, float(y.max()))
        anns.append({'segmentation': polys, 'area': area, 'iscrowd': 0,
                     'image_id': int(image_ids[i]),
                     'bbox': [round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2)],
                     'category_id': int(cats[i]), 'id': first_id + i})
    return anns


def write_split(root: str, split: str, num_images: int, num_anns: int, seed: int,
                jpeg: str) -> str:
    """``annotations/instances_<split>.json`` and ``<split>/`` (links to ``jpeg``)."""
    import numpy as np
    rng = np.random.default_rng(seed)
    width, height = IMAGE_SIZE
    img_dir = osp.join(root, split)
    os.makedirs(img_dir, exist_ok=True)
    ids = np.arange(1, num_images + 1)
    names = [f'{i:012d}.jpg' for i in ids]
    for name in names:
        dst = osp.join(img_dir, name)
        if not osp.lexists(dst):
            try:
                os.link(jpeg, dst)
            except OSError:  # another file system, or no hard links: a symlink then
                os.symlink(osp.abspath(jpeg), dst)
    # about 1 % of COCO's train images have no instance; every other image at least one
    with_objects = ids[rng.uniform(size=num_images) >= 0.01] if num_images > 1 else ids
    image_of = np.concatenate([with_objects, rng.choice(with_objects,
                                                        max(0, num_anns - len(with_objects)))])
    image_of = np.sort(image_of[:num_anns])
    path = osp.join(root, 'annotations', f'instances_{split}.json')
    os.makedirs(osp.dirname(path), exist_ok=True)
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
        f.write('{"info": ' + json.dumps({
            'description': 'COCO-size synthetic set (tools/analysis/benchmark_startup.py)',
            'version': str(DATA_VERSION), 'year': 2026}) +
            ', "licenses": [{"url": "http://creativecommons.org/licenses/by/2.0/", '
            '"id": 1, "name": "Attribution License"}], "images": [')
        images = [{'license': 1, 'file_name': name,
                   'coco_url': f'http://images.cocodataset.org/{split}/{name}',
                   'height': height, 'width': width, 'date_captured': '2013-11-14 11:18:45',
                   'flickr_url': f'http://farm4.staticflickr.com/{name}', 'id': int(i)}
                  for i, name in zip(ids, names)]
        f.write(json.dumps(images)[1:-1])
        f.write('], "annotations": [')
        chunk = 20000
        for start in range(0, num_anns, chunk):
            anns = _polygon_annotations(rng, image_of[start:start + chunk], start + 1,
                                        width, height)
            f.write((', ' if start else '') + json.dumps(anns)[1:-1])
        from mmdet.datasets import CocoDataset
        cats = [{'supercategory': 'object', 'id': i, 'name': name}
                for i, name in zip(COCO_CAT_IDS, CocoDataset.METAINFO['classes'])]
        f.write('], "categories": ' + json.dumps(cats) + '}')
    os.replace(tmp, path)
    return path


def make_coco_size_set(root: str, scale: float = 1.0, seed: int = 0) -> dict:
    """Write (or reuse) the COCO-size set in ``root``; returns its manifest."""
    want = {'version': DATA_VERSION, 'scale': scale, 'seed': seed}
    manifest = osp.join(root, 'benchmark_startup.json')
    if osp.isfile(manifest):
        with open(manifest) as f:
            found = json.load(f)
        if {k: found.get(k) for k in want} == want:
            return found
    from PIL import Image
    import numpy as np
    os.makedirs(root, exist_ok=True)
    jpeg = osp.join(root, 'image.jpg')
    width, height = IMAGE_SIZE
    yy, xx = np.mgrid[0:height, 0:width]
    pixels = np.stack([xx * 255 // width, yy * 255 // height, (xx + yy) % 256], -1)
    Image.fromarray(pixels.astype(np.uint8)).save(jpeg, quality=90)
    info = dict(want)
    for offset, (split, (num_images, num_anns)) in enumerate(COCO_SIZES.items()):
        n_img = max(2, round(num_images * scale))
        n_ann = max(n_img, round(num_anns * scale))
        path = write_split(root, split, n_img, n_ann, seed + offset, jpeg)
        info[split] = dict(images=n_img, annotations=n_ann, bytes=osp.getsize(path))
    with open(manifest, 'w') as f:
        json.dump(info, f, indent=1)
    return info
