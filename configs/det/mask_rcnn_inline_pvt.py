# The short name: Mask R-CNN + FPN with InLine-PVT-T, 1x, COCO.
_base_ = './mask-rcnn_inline-pvt-t_fpn_1x_coco.py'
