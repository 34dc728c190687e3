# UperNet, InLine-CSwin-B, ADE20K 512x512, 160k (recipe as InLine-CSwin-T).
_base_ = './upernet_inline-cswin-t_8xb2-160k_ade20k-512x512.py'

checkpoint = 'checkpoints/inline_cswin_b.pth'
model = dict(
    backbone=dict(arch='base', drop_path_rate=0.5,
                  init_cfg=dict(type='Pretrained', checkpoint=checkpoint)),
    decode_head=dict(in_channels=[96, 192, 384, 768]),
    auxiliary_head=dict(in_channels=384))
