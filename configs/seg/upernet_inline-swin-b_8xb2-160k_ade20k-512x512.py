# UperNet, InLine-Swin-B, ADE20K 512x512, 160k (recipe as InLine-Swin-T).
_base_ = './upernet_inline-swin-t_8xb2-160k_ade20k-512x512.py'

checkpoint = 'checkpoints/inline_swin_b.pth'
model = dict(
    backbone=dict(arch='base', init_cfg=dict(type='Pretrained', checkpoint=checkpoint)),
    decode_head=dict(in_channels=[128, 256, 512, 1024]),
    auxiliary_head=dict(in_channels=512))
