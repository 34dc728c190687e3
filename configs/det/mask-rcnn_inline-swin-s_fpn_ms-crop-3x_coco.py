# Mask R-CNN + FPN, InLine-Swin-S, 3x multi-scale with crops (mmdet's Swin-S 3x
# recipe, mixed precision, with the backbone swapped).
_base_ = ['mmdet::swin/mask-rcnn_swin-s-p4-w7_fpn_amp-ms-crop-3x_coco.py',
          '../_base_/runtime/inline_mm_runtime.py']
custom_imports = dict(imports=['inline_mm', 'inline_mm.engine'],
                      allow_failed_imports=False)
# atomic checkpoints, resume from the newest readable one (docs/reliability.md)
default_hooks = dict(checkpoint=dict(type='AtomicCheckpointHook'))
# a mid-epoch (preemption) checkpoint resumes after its last batch, not at the epoch's start
train_cfg = dict(type='ResumableEpochBasedTrainLoop')
# missing / broken images and degenerate annotations are skipped and logged, up to 1 %
train_dataloader = dict(dataset=dict(type='SkipBadSamples', dataset_type='CocoDataset',
                                     max_bad_fraction=0.01))

checkpoint = 'checkpoints/inline_swin_s.pth'
model = dict(
    backbone=dict(
        _delete_=True, type='InLineSwin', arch='small', drop_path_rate=0.3,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint)),
    neck=dict(in_channels=[96, 192, 384, 768]))
