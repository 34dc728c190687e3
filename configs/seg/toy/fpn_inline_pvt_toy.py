# Semantic FPN + InLine-PVT-T trained from scratch on the bundled synthetic
# ADE20K-layout set (python tools/make_toy_data.py --task seg), sized to learn on
# a 2-core CPU in minutes.  What it trades away against the full recipe
# (fpn_inline-pvt-t_4xb4-80k_ade20k-512x512.py): no ImageNet weights, 128x128
# inputs (the generated images are 256x256) without multi-scale crops or
# photometric distortion, a 64-channel FPN and head (256 / 128), plain BN,
# bf16 autocast on the CPU, and 4k iterations of 4 images instead of 80k of 16.
_base_ = 'mmseg::sem_fpn/fpn_r50_4xb4-160k_ade20k-512x512.py'
custom_imports = dict(imports=['inline_mm', 'inline_mm.datasets', 'inline_mm.engine',
                               'inline_mm.models.seg_losses'],
                      allow_failed_imports=False)

data_root = 'data/ade_toy/'
dataset_type = 'ADEToyDataset'  # ADE20KDataset with the toy classes (inline_mm.datasets)
num_classes = 4
image_size = (128, 128)  # the generated images are 256x256
width = 64
# batch 4 for 4000 iterations: the same images seen as 2000 of batch 8, about 15 %
# longer on the clock, with twice the updates (mIoU 56.5 -> 61.0 and 55.1 -> 65.0, seeds 0
# and 1, docs/demo_time.md)
max_iters = 4000
val_interval = max_iters

norm_cfg = dict(type='BN', requires_grad=True)
model = dict(
    pretrained=None,
    data_preprocessor=dict(size=image_size),
    backbone=dict(_delete_=True, type='InLinePVT', arch='tiny', drop_path_rate=0.0,
                  init_cfg=None),
    neck=dict(in_channels=[64, 128, 320, 512], out_channels=width),
    decode_head=dict(
        in_channels=[width] * 4, channels=width, num_classes=num_classes, norm_cfg=norm_cfg,
        # background covers ~85% of the pixels: weight it down so the shapes are learnt;
        # mmseg's CrossEntropyLoss with class_weight fails on padded (255) pixels, this
        # one (inline_mm.models.seg_losses) takes them
        loss_decode=dict(type='IgnoreSafeCrossEntropyLoss', use_sigmoid=False, loss_weight=1.0,
                         class_weight=[0.25, 1.0, 1.0, 1.0])))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=image_size, keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=4, num_workers=0, persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root,
                 data_prefix=dict(img_path='images/training',
                                  seg_map_path='annotations/training'),
                 pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=0, persistent_workers=False,
    dataset=dict(type=dataset_type, data_root=data_root,
                 data_prefix=dict(img_path='images/validation',
                                  seg_map_path='annotations/validation'),
                 pipeline=test_pipeline))
test_dataloader = val_dataloader

train_cfg = dict(type='IterBasedTrainLoop', max_iters=max_iters, val_interval=val_interval)
# bf16 autocast of the forward pass on CPUs with bf16 units (AVX512-BF16 / AMX:
# shorter iterations; parameters and optimiser state stay fp32); fp32 on CPUs
# without them, where bf16 kernels are slower.  On a GPU it changes nothing.
optim_wrapper = dict(
    _delete_=True, type='CPUAutocastOptimWrapper', dtype='bfloat16',
    only_with_bf16_units=True,
    # 3e-4: at batch 8, six runs (three seeds, bf16 and fp32) ended at mIoU 53.7-56.5;
    # 1e-3 spread over 48-62 (fp32 around 50), 2e-4 gave 43.8 (docs/demo_time.md)
    optimizer=dict(type='AdamW', lr=3e-4, weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={'pos_embed': dict(decay_mult=0.),
                                    'norm': dict(decay_mult=0.)}),
    clip_grad=dict(max_norm=10.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=40),
    dict(type='PolyLR', eta_min=1e-5, power=0.9, begin=40, end=max_iters, by_epoch=False),
]
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=10, log_metric_by_epoch=False),
    checkpoint=dict(type='AtomicCheckpointHook', by_epoch=False, interval=val_interval,
                    max_keep_ckpts=2))
randomness = dict(seed=0)
env_cfg = dict(dist_cfg=dict(backend='gloo'))
# losses logged as the mean over all processes; random states saved for exact resume
custom_hooks = [dict(type='MeanLossLoggerHook'), dict(type='RNGStateHook'),
                dict(type='PreemptionHook'), dict(type='NonFiniteLossHook', max_consecutive=5)]
# the total batch size the learning rate is set for (tools/train.py --auto-scale-lr)
auto_scale_lr = dict(enable=False, base_batch_size=4)
