# Mask R-CNN + FPN, InLine-PVT-T, 1x schedule (12 epochs), COCO instance segmentation.
# mmdet's own Mask R-CNN R-50 1x recipe with the backbone swapped and the PVT
# paper's optimiser (AdamW; lr 2e-4 for 8 GPUs x 2 images, weight decay 1e-4),
# no weight decay on position tables and norms.
# Weights: the authors' ImageNet-1K InLine-PVT-T checkpoint (see configs/det/README.md),
# saved as checkpoints/inline_pvt_t.pth; loaded as is through init_cfg.
_base_ = ['mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
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

checkpoint = 'checkpoints/inline_pvt_t.pth'
model = dict(
    backbone=dict(
        _delete_=True, type='InLinePVT', arch='tiny', drop_path_rate=0.1,
        out_indices=(0, 1, 2, 3),
        init_cfg=dict(type='Pretrained', checkpoint=checkpoint)),
    neck=dict(in_channels=[64, 128, 320, 512]))

optim_wrapper = dict(
    optimizer=dict(_delete_=True, type='AdamW', lr=2e-4, betas=(0.9, 0.999),
                   weight_decay=1e-4),
    paramwise_cfg=dict(custom_keys={
        'pos_embed': dict(decay_mult=0.),
        'norm': dict(decay_mult=0.)}))
