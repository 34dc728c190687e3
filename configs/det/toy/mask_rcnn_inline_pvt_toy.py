# Mask R-CNN + InLine-PVT-T trained from scratch on the bundled synthetic COCO-format
# set (python tools/make_toy_data.py --task det), sized to learn on a 2-core CPU in
# minutes.  What it trades away against the full recipe
# (mask-rcnn_inline-pvt-t_fpn_1x_coco.py): no ImageNet weights, 192x192 inputs,
# FPN / RPN / RoI heads 64 channels wide (256 in the full recipe), a 2-conv mask
# head (4), 64 sampled RoIs per image (512), RoIAlign with 2x2 samples per bin
# (adaptive), 256-d box FC layers (1024), fewer proposals, and an iteration-based
# schedule of 1500 steps of batch 2.
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'
custom_imports = dict(imports=['inline_mm', 'inline_mm.datasets', 'inline_mm.engine'],
                      allow_failed_imports=False)

data_root = 'data/coco_toy/'
classes = ('circle', 'rectangle', 'triangle')
metainfo = dict(classes=classes, palette=[(220, 20, 60), (0, 130, 200), (60, 180, 75)])
image_size = (192, 192)  # the generated images are 256x256
width = 64  # channels of the neck and heads
gn = dict(type='GN', num_groups=16, requires_grad=True)
max_iters = 1500
val_interval = max_iters

model = dict(
    data_preprocessor=dict(pad_size_divisor=32),
    backbone=dict(_delete_=True, type='InLinePVT', arch='tiny', drop_path_rate=0.0,
                  init_cfg=None),
    # GroupNorm in the neck and heads: detectors trained from scratch converge
    # much faster with normalised heads (He et al., Rethinking ImageNet Pre-training)
    neck=dict(in_channels=[64, 128, 320, 512], out_channels=width, norm_cfg=gn),
    rpn_head=dict(in_channels=width, feat_channels=width,
                  anchor_generator=dict(scales=[4], ratios=[0.5, 1.0, 2.0])),
    roi_head=dict(
        # 2x2 samples per RoIAlign bin instead of adaptive (up to 3x3 for the largest
        # objects on the stride-4 level): mmcv's CPU RoIAlign runs on one thread, and
        # was a quarter of an iteration
        bbox_roi_extractor=dict(out_channels=width, roi_layer=dict(sampling_ratio=2)),
        bbox_head=dict(type='Shared4Conv1FCBBoxHead', in_channels=width,
                       conv_out_channels=width, fc_out_channels=256, norm_cfg=gn,
                       num_classes=len(classes)),
        mask_roi_extractor=dict(out_channels=width, roi_layer=dict(sampling_ratio=2)),
        mask_head=dict(num_convs=2, in_channels=width, conv_out_channels=width,
                       norm_cfg=gn, num_classes=len(classes))),
    train_cfg=dict(
        rpn=dict(sampler=dict(num=128)),
        rpn_proposal=dict(nms_pre=500, max_per_img=300),
        rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(
        rpn=dict(nms_pre=500, max_per_img=300),
        rcnn=dict(max_per_img=20)))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    # bad images / annotations are skipped and logged (inline_mm.engine.SkipBadSamples)
    dataset=dict(type='SkipBadSamples', dataset_type='CocoDataset', max_bad_fraction=0.01,
                 data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/instances_train.json',
                 data_prefix=dict(img='train/'), pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, metainfo=metainfo,
                 ann_file='annotations/instances_val.json',
                 data_prefix=dict(img='val/'), pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator

train_cfg = dict(_delete_=True, type='IterBasedTrainLoop', max_iters=max_iters,
                 val_interval=val_interval)
# CPUAutocastOptimWrapper: bf16 autocast on CPUs with bf16 units (AVX512-BF16 / AMX),
# fp32 on the others, where bf16 kernels are slower: backbone, neck, RPN and the RoI
# heads' convolutions and FC layers; mmcv's CPU RoIAlign and NMS between them take
# fp32 (each part's outputs are cast back).  Parameters, gradients and optimiser state
# stay fp32.  On a GPU it changes nothing (--amp: fp16 there).
optim_wrapper = dict(
    type='CPUAutocastOptimWrapper', dtype='bfloat16', only_with_bf16_units=True,
    parts=['backbone', 'neck', 'rpn_head', 'roi_head.bbox_head', 'roi_head.mask_head'],
    optimizer=dict(_delete_=True, type='AdamW', lr=1e-3, weight_decay=0.05),
    paramwise_cfg=dict(custom_keys={'pos_embed': dict(decay_mult=0.),
                                    'norm': dict(decay_mult=0.)}),
    clip_grad=dict(max_norm=10.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', by_epoch=False, begin=50, end=max_iters, eta_min=1e-5),
]
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=10),
    checkpoint=dict(type='AtomicCheckpointHook', by_epoch=False, interval=val_interval,
                    max_keep_ckpts=2))
log_processor = dict(by_epoch=False)
randomness = dict(seed=0)
env_cfg = dict(dist_cfg=dict(backend='gloo'))
auto_scale_lr = dict(enable=False, base_batch_size=2)
# losses logged as the mean over all processes; random states saved for exact resume;
# SIGTERM / SIGUSR1 checkpoint and exit 75; NaN / Inf steps skipped (docs/reliability.md)
custom_hooks = [dict(type='MeanLossLoggerHook'), dict(type='RNGStateHook'),
                dict(type='PreemptionHook'), dict(type='NonFiniteLossHook', max_consecutive=5)]
